"""The chat view: a list model over the branch shown and a delegate that paints each message as a text document.

Only the rows on screen are rendered (others get a cheap size estimate until they scroll into view), so a
1,000-message chat opens at once; a streaming message is re-rendered only when its text changed.
"""
from __future__ import annotations

import time
from collections import OrderedDict

from PySide6.QtCore import (
    QAbstractListModel, QEvent, QModelIndex, QPersistentModelIndex, QPoint, QRect, QSize, Qt, QTimer, QUrl, Signal,
)
from PySide6.QtGui import (QAbstractTextDocumentLayout, QColor, QDesktopServices, QGuiApplication, QPainter, QPalette,
                           QTextDocument)
from PySide6.QtWidgets import (QAbstractItemView, QListView, QMenu, QStyle, QStyledItemDelegate, QStyleOptionViewItem,
                               QToolTip)

from app.core.conversations import Message
from app.core.markdown_render import MarkdownRenderer, link_tip, link_url, openable
from app.core.message_html import Names, accessible_text, message_actions, message_html
from app.core.reasoning import copied_text
from app.core.chats import ChatService
from app.qt.stream_document import SafeDocument, StreamDocument

MESSAGE_ROLE = Qt.ItemDataRole.UserRole + 1
MARGIN, PAD = 10, 10
CACHE_SIZE = 300
ESTIMATES_KEPT = 20_000  # messages whose estimated height is kept (a few MB at most)
LONG_DOCUMENT = 20_000  # characters: laying one out again takes ~100 ms here, so a resize reflows it once it settles
RESIZE_SETTLE_MS = 150
CATCH_UP_S = 0.010  # a streaming message's Markdown, then its document, take this long a turn of the event loop to catch
# up (a chat opened mid-answer rendered and built all of a 60,000-character one at once: a 300-600 ms stall); the rest
# goes in over the next turns


class ChatModel(QAbstractListModel):
    def __init__(self, service: ChatService, parent=None):
        super().__init__(parent)
        self.service = service
        self.conv_id: int | None = None
        self._ids: list[int] = []
        self._rows: dict[int, int] = {}
        service.path_changed.connect(self._on_path_changed)
        service.message_changed.connect(self._on_message_changed)
        service.conversations_changed.connect(self._on_conversations)

    def set_conversation(self, conv_id: int | None) -> None:
        self.beginResetModel()
        self.conv_id = conv_id
        self._set_ids(self._path_ids())
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._ids)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or index.row() >= len(self._ids) or not self.service.store.has_message(self._ids[index.row()]):
            return None
        msg = self.service.store.message(self._ids[index.row()])
        if role == MESSAGE_ROLE:
            return msg
        if role == Qt.ItemDataRole.DisplayRole:
            return msg.content
        if role == Qt.ItemDataRole.AccessibleTextRole:
            versions = self.service.store.versions(msg)
            return accessible_text(msg, versions.index(msg) + 1, len(versions), names_of(self.service, msg))
        return None

    def row_of(self, msg_id: int) -> int | None:
        return self._rows.get(msg_id)

    def message_at(self, row: int) -> Message:
        return self.service.store.message(self._ids[row])

    def _path_ids(self) -> list[int]:
        if self.conv_id is None or not self.service.store.has(self.conv_id):
            return []
        return [m.id for m in self.service.store.path(self.conv_id)]

    def _set_ids(self, ids: list[int]) -> None:
        self._ids = ids
        self._rows = {mid: i for i, mid in enumerate(ids)}

    def _on_path_changed(self, conv_id: int) -> None:
        if conv_id != self.conv_id:
            return
        new, old = self._path_ids(), self._ids
        if new[: len(old)] == old and len(new) > len(old):  # messages appended: no reset, no re-render
            self.beginInsertRows(QModelIndex(), len(old), len(new) - 1)
            self._set_ids(new)
            self.endInsertRows()
        elif new != old:
            self.beginResetModel()
            self._set_ids(new)
            self.endResetModel()
        elif new:
            self.dataChanged.emit(self.index(0), self.index(len(new) - 1))  # version counters may have changed

    def _on_conversations(self) -> None:
        if self.conv_id is not None and not self.service.store.has(self.conv_id):
            self.set_conversation(None)

    def _on_message_changed(self, conv_id: int, msg_id: int) -> None:
        if conv_id == self.conv_id:
            self.message_changed(msg_id)

    def message_changed(self, msg_id: int) -> None:
        """Redraws one message of this conversation (its text or how it is shown changed)."""
        row = self._rows.get(msg_id)
        if row is not None:
            self.dataChanged.emit(self.index(row), self.index(row))


class MessageDelegate(QStyledItemDelegate):
    """Paints messages as QTextDocuments cached per (content, state, theme); a new width only lays one out again."""

    def __init__(self, service: ChatService, view: QListView):
        super().__init__(view)
        self.service, self.view = service, view
        self.renderer = self._renderer(view.palette().color(QPalette.ColorRole.Base).lightness() < 128)
        self._docs: OrderedDict[int, tuple[tuple, QTextDocument, list[str]]] = OrderedDict()
        self._estimates: dict[int, tuple[int, int, int]] = {}  # message -> (its text's length, width, estimated height)
        self._streams: dict[int, StreamDocument] = {}  # the documents of streaming messages, edited in place
        self._partial: set[int] = set()  # messages whose document is still taking its parts, a slice a turn
        self._next_slices: set[int] = set()  # those of them drawn again at the next turn of the event loop
        self._reported: dict[int, int] = {}  # height the view's last layout pass placed each message at
        self.laying_out = False  # set by the view around a layout pass: other sizeHint calls (painting) move nothing
        self._recheck: dict[int, QPersistentModelIndex] = {}
        self._drawn: set[int] = set()  # messages the view's last paint drew
        self._drawing: set[int] = set()  # those its paint under way has drawn so far
        self.shown_thoughts: set[int] = set()  # messages whose finished thought the user unfolded
        # text width below which an answer's links go under its name (0: never; a chat's drag renders nothing again)
        self.narrow_below = 0
        self.renders = 0  # documents built (tests and benchmarks read it)
        self.resizing = False  # set by the view while the user resizes it: long documents keep their width till it ends

    def set_dark(self, dark: bool) -> None:
        self.renderer = self._renderer(dark)
        self.forget()

    def _renderer(self, dark: bool) -> MarkdownRenderer:
        """Markdown drawn on an answer's bubble (a table's cells take its colour)."""
        return MarkdownRenderer(dark=dark, background=_bubble(self.view.palette(), "assistant").name())

    def forget(self) -> None:
        """Drops every rendered message (a new theme or font): each renders again when next on screen."""
        self._docs.clear()
        self._streams.clear()
        self._partial.clear()

    def text_width(self) -> int:
        return max(120, self.view.viewport().width() - 2 * (MARGIN + PAD))

    def _key(self, msg: Message) -> tuple:
        versions = self.service.store.versions(msg)
        return (len(msg.content), msg.state, msg.error, versions.index(msg), len(versions), self.renderer.dark,
                msg.id in self.shown_thoughts, self.text_width() < self.narrow_below, names_of(self.service, msg),
                self.service.busy(msg.conversation_id))

    def document(self, msg: Message) -> tuple[QTextDocument, list[str]]:
        width = self.text_width()
        key = self._key(msg)
        hit = self._docs.get(msg.id)
        if hit is not None and hit[0] == key and msg.id not in self._partial:
            self._docs.move_to_end(msg.id)
            if not self._fits(hit[1], width):  # resized: laid out again, not rendered again
                hit[1].setTextWidth(width)
            return hit[1], hit[2]
        versions = self.service.store.versions(msg)
        # busy: the chat's answer streams, and links it would refuse (Regenerate, Continue) are not shown
        rendered = message_html(msg, versions.index(msg) + 1, len(versions), self.renderer, busy=key[-1],
                                show_thought=msg.id in self.shown_thoughts, deadline=time.perf_counter() + CATCH_UP_S,
                                names=key[-2], narrow=key[-3])
        stream = self._streams.get(msg.id) if hit is not None else None
        if stream is None or stream.doc is not hit[1]:
            stream = None
            if msg.state == "streaming":
                stream = self._streams[msg.id] = StreamDocument(self._new_document())
        if stream is not None:  # the next tokens, or the end: only the blocks that changed, a slice a turn
            doc = stream.doc
            if stream.update(list(rendered.parts), CATCH_UP_S) and rendered.complete:
                self._partial.discard(msg.id)
            else:
                self._catch_up(msg.id)
        else:  # a finished message shown anew
            self._streams.pop(msg.id, None)
            doc = self._new_document()
            doc.setHtml(rendered.html)
        if not self._fits(doc, width):
            doc.setTextWidth(width)
        self.renders += 1
        self._docs[msg.id] = (key, doc, rendered.code_blocks)
        self._docs.move_to_end(msg.id)
        while len(self._docs) > CACHE_SIZE:
            self._streams.pop(self._docs.popitem(last=False)[0], None)
        return doc, rendered.code_blocks

    def _catch_up(self, msg_id: int) -> None:
        """The message drawn again at the next turn of the event loop, its document taking its next slice then."""
        self._partial.add(msg_id)
        if msg_id not in self._next_slices:
            self._next_slices.add(msg_id)
            QTimer.singleShot(0, self, lambda: self._next_slice(msg_id))

    def _next_slice(self, msg_id: int) -> None:
        self._next_slices.discard(msg_id)
        if msg_id in self._partial:
            self.view.model().message_changed(msg_id)

    def _fits(self, doc: QTextDocument, width: int) -> bool:
        """Whether `doc` may be drawn as it is laid out: at `width`, or a long one while the view is being resized (each
        step of a drag laid all of a 2,000-line answer out again: 100-400 ms a step)."""
        return doc.textWidth() == width or (self.resizing and doc.textWidth() > 0 and doc.characterCount() > LONG_DOCUMENT)

    def _new_document(self) -> QTextDocument:
        doc = SafeDocument()
        doc.setDocumentMargin(0)
        doc.setDefaultFont(self.view.font())
        doc.setDefaultStyleSheet(_stylesheet(self.view.palette()))
        return doc

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        msg = index.data(MESSAGE_ROLE)
        if msg is None:
            return QSize(0, 0)
        width = self.text_width()
        hit = self._docs.get(msg.id)
        key = self._key(msg) if hit is not None else None  # a layout asks every row: only a drawn one needs its key
        if hit is not None and hit[0] == key and self._fits(hit[1], width):
            height = int(hit[1].size().height())
        elif hit is not None and self._grown(hit, key) and self._fits(hit[1], width):
            # a streaming answer off screen: its document as last drawn and an estimate of the text since (the estimate
            # of all of it was a 34-row table 174 px short, which it jumped by when scrolled back into view)
            height = int(hit[1].size().height()) + _estimate_added(msg.content[hit[0][0]:], width)
        else:
            height = self._estimate(msg, width)
        if self.laying_out:
            self._reported[msg.id] = height
        return QSize(width, height + 2 * PAD + MARGIN)

    def _estimate(self, msg: Message, width: int) -> int:
        """_estimate's height, kept per message while its text and the width stay: a layout of a 600-message chat
        split and measured every message's text again (~47 ms of each ~47 ms layout, every time one drawn anew took
        its real height)."""
        kept = self._estimates.get(msg.id)
        if kept is None or kept[:2] != (len(msg.content), width):
            if len(self._estimates) >= ESTIMATES_KEPT:
                self._estimates.clear()
            kept = self._estimates[msg.id] = (len(msg.content), width, _estimate(msg.content, width))
        return kept[2]

    def _grown(self, hit: tuple, key: tuple) -> bool:
        """Whether a cached document is a streaming message's as it was a few tokens ago (its text grown since)."""
        return key[1] == "streaming" and hit[0][1:] == key[1:] and hit[0][0] <= key[0]

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        msg = index.data(MESSAGE_ROLE)
        if msg is None:
            return
        doc, _ = self.document(msg)
        self._drawing.add(msg.id)
        box = option.rect.adjusted(MARGIN, MARGIN // 2, -MARGIN, -MARGIN // 2)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(_bubble(self.view.palette(), msg.role))
        painter.drawRoundedRect(box, 8, 8)
        if option.state & QStyle.StateFlag.State_HasFocus and self.view.hasFocus():
            # the keyboard's current message (Up/Down move it, Enter or the Menu key opens its actions)
            painter.setPen(self.view.palette().color(QPalette.ColorRole.Highlight))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(box.adjusted(1, 1, -1, -1), 8, 8)
        painter.translate(box.left() + PAD, box.top() + PAD)
        ctx = QAbstractTextDocumentLayout.PaintContext()
        ctx.palette = self.view.palette()
        # only the part on screen: drawing all of a 2,000-line answer on every token cost more than rendering it
        on_screen = self.view.viewport().rect().translated(-box.left() - PAD, -box.top() - PAD)
        ctx.clip = QRect(0, 0, box.width(), box.height()).intersected(on_screen)
        painter.setClipRect(ctx.clip)
        if not ctx.clip.isEmpty():  # an empty clip would draw it all
            doc.documentLayout().draw(painter, ctx)
        painter.restore()
        if int(doc.size().height()) != self._reported.get(msg.id):
            self._recheck[msg.id] = QPersistentModelIndex(index)
            QTimer.singleShot(0, self._apply_rechecks)

    def text_changed(self, index: QModelIndex) -> None:
        """A streaming message on screen takes its new text now, in the drain that brought it (whose cost the frame
        pacer measures), not at its paint: laid out at its cheap size estimate until then, it was drawn a screen away
        from its end, then drawn again at its height and again scrolled (2-4 paints a token)."""
        msg = index.data(MESSAGE_ROLE)
        if msg is not None and msg.id in self._streams and msg.id in self._drawn | self._drawing:
            self.document(msg)

    def frame_started(self) -> None:
        """The view starts a paint: what its last one drew is what is on screen."""
        self._drawn, self._drawing = self._drawing, set()

    def _apply_rechecks(self) -> None:
        pending, self._recheck = self._recheck, {}
        for pindex in pending.values():
            if pindex.isValid():
                self.sizeHintChanged.emit(QModelIndex(pindex))

    def anchor_at(self, index: QModelIndex, pos: QPoint) -> tuple[str, list[str]]:
        """The link under `pos` (view coordinates), and the message's code blocks."""
        msg = index.data(MESSAGE_ROLE)
        if msg is None:
            return "", []
        doc, blocks = self.document(msg)
        rect = self.view.visualRect(index)
        local = pos - rect.topLeft() - QPoint(MARGIN + PAD, MARGIN // 2 + PAD)
        return doc.documentLayout().anchorAt(local.toPointF()), blocks


class ChatView(QListView):
    """Links in messages: versions, edit, regenerate, copy. Keeps to the bottom while the answer streams."""

    edit_requested = Signal(int)  # user message id
    # here too, as Qt lays the view out while __init__ builds its model
    _stick = True  # kept to the bottom
    _reset_anchor: tuple[int, int] | None = None  # the anchor as the rows were before they changed (a version switched)
    _after_reset = False  # the next layout follows rows reset, added or removed: their old places are gone

    def __init__(self, service: ChatService, parent=None):
        super().__init__(parent)
        self.service = service
        self.chat_model = ChatModel(service, self)
        self.setModel(self.chat_model)
        self.delegate = MessageDelegate(service, self)
        self.setItemDelegate(self.delegate)
        self.chat_model.dataChanged.connect(self._on_data_changed)
        for changing in (self.chat_model.modelAboutToBeReset, self.chat_model.rowsAboutToBeInserted,
                         self.chat_model.rowsAboutToBeRemoved):  # each drops the rows' places until the next layout
            changing.connect(self._before_rows_change)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.verticalScrollBar().setSingleStep(24)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setMouseTracking(True)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setUniformItemSizes(False)
        self.setObjectName("chatView")
        self.setAccessibleName(self.tr("Messages"))
        self._stick = True
        self._busy = False  # whether the chat shown was answering when its messages were last drawn for it
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(lambda v: setattr(self, "_stick", v >= bar.maximum() - 8))
        bar.rangeChanged.connect(lambda _lo, hi: bar.setValue(hi) if self._stick else None)
        service.status_changed.connect(self._on_status)
        # an answer's names: a model picked (its unload note says what answers now), a model loaded (older answers'
        # names read as listed once its own name is known)
        service.settings_changed.connect(self._on_settings)
        service.models.loaded.connect(self._on_names)
        service.models.own_name_known.connect(self._on_names)  # or a model's own name read from its file
        self._resized = QTimer(self, singleShot=True, interval=RESIZE_SETTLE_MS)
        self._resized.timeout.connect(self._resize_settled)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.delegate.resizing = True
        self._resized.start()
        super().resizeEvent(event)

    def _resize_settled(self) -> None:
        self.delegate.resizing = False
        self.scheduleDelayedItemsLayout()  # long messages take the new width now, once
        self.viewport().update()

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.delegate.frame_started()
        super().paintEvent(event)

    def _before_rows_change(self, *_rows) -> None:
        if not self._after_reset:  # a second change before the layout: the rows' places are already gone
            self._reset_anchor = None if self._stick else self._anchor()
            self._after_reset = True

    def doItemsLayout(self) -> None:  # noqa: N802 - Qt's name
        # after the rows changed: the place from before, unless the view was sent to the bottom since (a send)
        anchor = None if self._stick else self._reset_anchor if self._after_reset else self._anchor()
        self._after_reset = False
        self.delegate.laying_out = True
        try:
            super().doItemsLayout()
        finally:
            self.delegate.laying_out = False
        if anchor is not None:
            self._keep_anchor(*anchor)

    def _anchor(self) -> tuple[int, int] | None:
        """(message, top) of the first message whose top is on screen (else the one at the top): messages above it
        that take their real height once drawn (the estimate of a code-heavy answer is off by 1,000 px and more) leave
        it where it is, as a streaming answer grows below its top. Found by the rows' tops: indexAt() misses while
        a row's height has changed and the rows below it are not yet moved."""
        rows = self.model().rowCount()
        lo, hi = 0, rows
        while lo < hi:  # the first row whose top is at or below the viewport's top
            mid = (lo + hi) // 2
            if self.visualRect(self.model().index(mid, 0)).top() < 0:
                lo = mid + 1
            else:
                hi = mid
        if lo == rows or lo > 0 and self.visualRect(self.model().index(lo, 0)).top() >= self.viewport().height():
            lo -= 1  # none starts on screen: the one covering it
        msg = self.model().index(lo, 0).data(MESSAGE_ROLE) if lo >= 0 else None
        return (msg.id, self.visualRect(self.model().index(lo, 0)).top()) if msg is not None else None

    def _keep_anchor(self, msg_id: int, top: int) -> None:
        row = self.chat_model.row_of(msg_id)
        if row is None:
            return
        moved = self.visualRect(self.model().index(row, 0)).top() - top
        if moved:
            bar = self.verticalScrollBar()
            bar.setValue(bar.value() + moved)

    def _on_data_changed(self, top: QModelIndex, bottom: QModelIndex) -> None:
        if top == bottom:  # one message's text or state
            self.delegate.text_changed(top)

    def _on_status(self, conv_id: int) -> None:
        """A turn starting or ending shows or hides the links a busy chat refuses: the messages on screen drawn again.
        Only then: the status changes with every token, and the update it asked for drew the view a second time."""
        if conv_id == self.chat_model.conv_id and self.service.busy(conv_id) != self._busy:
            self._busy = not self._busy
            self.viewport().update()

    def _on_settings(self, conv_id: int) -> None:
        if conv_id == self.chat_model.conv_id:
            self._on_names()

    def _on_names(self, *_key: str) -> None:
        self.viewport().update()  # drawn again: messages whose names changed render anew (the names are in their key)

    def set_conversation(self, conv_id: int | None) -> None:
        self._stick = True
        self._busy = conv_id is not None and self.service.busy(conv_id)
        self.chat_model.set_conversation(conv_id)
        self.scrollToBottom()

    def follow(self) -> None:
        """Back to the bottom, and kept there as the answer grows (after a send, even from far up)."""
        self._stick = True
        self.scrollToBottom()

    def set_dark(self, dark: bool) -> None:
        self.delegate.set_dark(dark)
        self.chat_model.set_conversation(self.chat_model.conv_id)

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:  # the desktop's text size: every message is laid out anew
            self.delegate.forget()
            self.scheduleDelayedItemsLayout()

    def mouseMoveEvent(self, event) -> None:
        href = self._href(event.position().toPoint())[0]
        self.viewport().setCursor(Qt.CursorShape.PointingHandCursor if href else Qt.CursorShape.ArrowCursor)
        tip = link_tip(href)
        if tip:
            QToolTip.showText(event.globalPosition().toPoint(), tip, self.viewport())
        elif QToolTip.isVisible():
            QToolTip.hideText()
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event) -> None:
        href, msg, blocks = self._href(event.position().toPoint())
        if href and event.button() == Qt.MouseButton.LeftButton:
            self.activate(msg, href, blocks)
            return
        super().mouseReleaseEvent(event)

    def _href(self, pos: QPoint) -> tuple[str, Message | None, list[str]]:
        index = self.indexAt(pos)
        if not index.isValid():
            return "", None, []
        href, blocks = self.delegate.anchor_at(index, pos)
        return href, index.data(MESSAGE_ROLE), blocks

    # -- every link is also in the message's menu: right click, the Menu key, Shift+F10 or Enter
    def contextMenuEvent(self, event) -> None:
        from_mouse = event.reason() == event.Reason.Mouse
        index = self.indexAt(event.pos()) if from_mouse else self.currentIndex()
        pos = event.globalPos() if from_mouse else self.viewport().mapToGlobal(self.visualRect(index).center())
        self.show_actions(index, pos)

    def keyPressEvent(self, event) -> None:
        menu_key = event.key() == Qt.Key.Key_Menu or (event.key() == Qt.Key.Key_F10 and event.modifiers() & Qt.KeyboardModifier.ShiftModifier)
        if (menu_key or event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)) and self.currentIndex().isValid():
            index = self.currentIndex()
            self.show_actions(index, self.viewport().mapToGlobal(self.visualRect(index).center()))
            return
        super().keyPressEvent(event)

    def focusInEvent(self, event) -> None:
        if not self.currentIndex().isValid() and self.model().rowCount():
            self.setCurrentIndex(self.model().index(self.model().rowCount() - 1, 0))  # the latest message
        super().focusInEvent(event)

    def show_actions(self, index: QModelIndex, pos: QPoint) -> QMenu | None:
        msg = index.data(MESSAGE_ROLE) if index.isValid() else None
        if msg is None:
            return None
        versions = self.service.store.versions(msg)
        busy = self.service.busy(msg.conversation_id)
        doc, blocks = self.delegate.document(msg)
        menu = QMenu(self)
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        for label, href in message_actions(msg, versions.index(msg) + 1, len(versions), busy):
            menu.addAction(self.tr(label), lambda h=href: self.activate(msg, h, blocks))
        for n in range(len(blocks)):
            menu.addAction(self.tr("Copy code block %1").replace("%1", str(n + 1)),
                           lambda n=n: self.activate(msg, f"copy:{n}", blocks))
        for href in _links(doc):
            url = link_url(href)
            label = (url if len(url) <= 60 else url[:57] + "…").replace("&", "&&")  # a lone & would mark a shortcut
            menu.addAction(self.tr("Open %1").replace("%1", label), lambda h=href: self.activate(msg, h, blocks))
        menu.popup(pos)
        self.last_menu = menu
        return menu

    def activate(self, msg: Message, href: str, blocks: list[str] | None = None) -> None:
        """Carries out a message link (also what tests call)."""
        verb, _, arg = href.partition(":")
        if verb in ("prev", "next"):
            self.service.switch_version(msg.id, -1 if verb == "prev" else 1)
        elif verb == "regen":
            self.service.regenerate(msg.conversation_id, msg.id)
        elif verb == "regen-seed" and arg.isdigit():
            self.service.regenerate(msg.conversation_id, msg.id, seed=int(arg))
        elif verb == "continue":
            self.service.continue_answer(msg.conversation_id, msg.id)
        elif verb == "edit":
            self.edit_requested.emit(msg.id)
        elif verb == "copymsg":
            QGuiApplication.clipboard().setText(copied_text(msg.content) if msg.role == "assistant" else msg.content)
        elif verb == "think":
            self.delegate.shown_thoughts ^= {msg.id}
            self.chat_model.message_changed(msg.id)
        elif verb == "copy" and blocks is not None and arg.isdigit() and int(arg) < len(blocks):
            QGuiApplication.clipboard().setText(blocks[int(arg)])
        elif (url := link_url(href)) is not None and openable(url):
            QDesktopServices.openUrl(QUrl(url))


def names_of(service: ChatService, msg: Message) -> Names:
    """How an answer names models now (a user's message names none)."""
    if msg.role != "assistant":
        return Names()
    return Names(*service.model_names(msg.conversation_id, msg.model))


def _links(doc: QTextDocument) -> list[str]:
    """The `open:` links of a message's text that a click opens, in order, once each (for its menu: keyboard users)."""
    found = []
    block = doc.begin()
    while block.isValid():  # every block in document order, those inside tables too
        it = block.begin()
        while not it.atEnd():
            href = it.fragment().charFormat().anchorHref()
            url = link_url(href)
            if url is not None and openable(url) and href not in found:
                found.append(href)
            it += 1
        block = block.next()
    return found


def _estimate(text: str, width: int) -> int:
    per_line = max(20, width // 8)
    lines = sum(1 + len(line) // per_line for line in text.split("\n")) if text else 1
    return 22 + lines * 19


def _estimate_added(text: str, width: int) -> int:
    """_estimate's height of text added after a document's last line (its first line goes on that one)."""
    per_line = max(20, width // 8)
    return sum(len(line) // per_line for line in text.split("\n")) * 19 + text.count("\n") * 19


def _bubble(palette: QPalette, role: str) -> QColor:
    base = palette.color(QPalette.ColorRole.Base)
    accent = palette.color(QPalette.ColorRole.Highlight)
    if role != "user":
        return base
    mixed = QColor(
        int(base.red() * 0.88 + accent.red() * 0.12),
        int(base.green() * 0.88 + accent.green() * 0.12),
        int(base.blue() * 0.88 + accent.blue() * 0.12),
    )
    return mixed


def _stylesheet(palette: QPalette) -> str:
    link = palette.color(QPalette.ColorRole.Link).name()
    return (f"a {{ color: {link}; text-decoration: none; }} "
            "pre, code { font-family: 'DejaVu Sans Mono', monospace; } "
            "h1 { font-size: large; } h2 { font-size: medium; } p { margin-top: 4px; margin-bottom: 4px; }")
