"""The sidebar: new chat, search by title and text, the list of chats (pinned first) with rename/pin/delete."""
from __future__ import annotations

from functools import partial
from typing import Callable

from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtWidgets import QLineEdit, QListView, QMenu, QPushButton, QVBoxLayout, QWidget

from app.core.chats import ChatService
from app.qt.background import Background
from app.qt.chat_list import CONV_ROLE, ChatListModel, TitleDelegate
from app.qt.theme import icon


class SearchBox(QLineEdit):
    """Esc clears a search (and goes no further); in an empty box it reaches the window, which stops the answer."""

    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Escape and not event.modifiers() and self.text():
            self.clear()
            event.accept()
            return
        super().keyPressEvent(event)


class Sidebar(QWidget):
    selected = Signal(int)  # conversation
    new_requested = Signal()
    delete_requested = Signal(int)  # conversation: the window trashes it and offers Undo

    def __init__(self, service: ChatService, parent=None):
        super().__init__(parent, objectName="sidebar")
        self.service = service
        self.setMinimumWidth(180)
        self.new_button = QPushButton(icon("new"), self.tr("New chat"))
        self.new_button.setToolTip(self.tr("New chat (Ctrl+N)"))
        self.search = SearchBox(placeholderText=self.tr("Search chats…"), clearButtonEnabled=True)
        self.search.setAccessibleName(self.tr("Search chats"))
        self._icons = {"pin": icon("pin"), "busy": icon("streaming", "#3b82f6")}
        self.model = ChatListModel(self._icons, self)
        self.list = QListView(objectName="sidebarList")
        self.list.setModel(self.model)
        self.list.setItemDelegate(TitleDelegate(self.list))
        self.list.setAccessibleName(self.tr("Chats"))
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        # one-line rows of one height: without this every change measured every row (Python data() calls each)
        self.list.setUniformItemSizes(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        self._current: int | None = None
        self._refreshing = False
        self._stale = False  # a refresh waits for the rename editor to close
        # a search of the messages runs on a worker (on the GUI thread each keystroke of a common phrase in 3,000 chats
        # froze the window 50-70 ms), one at a time: typed on meanwhile, the latest text is looked for once it is back
        self._searcher = Background(self)
        self._asked: str | None = None  # the text the worker looks for now
        self._wanted = ""  # the text in the box, as the worker reads it (a search for another one stops)
        self._again = False  # the text or the chats changed while it looked
        self._found: tuple[str, set[int]] | None = None  # the last text found and the chats whose messages hold it
        self.new_button.clicked.connect(self.new_requested)
        self.search.textChanged.connect(self.refresh)
        self.list.selectionModel().currentChanged.connect(self._on_current)
        self.model.renamed.connect(self._on_renamed)
        self.list.itemDelegate().closeEditor.connect(self._after_edit)
        self.list.customContextMenuRequested.connect(self._menu)
        service.conversations_changed.connect(self.refresh)
        service.status_changed.connect(self._on_status)
        self.refresh()  # the chats already in the store (a restart): the list is never empty while they exist

    def set_current(self, conv_id: int | None) -> None:
        self._current = conv_id
        if self.model.row_of(conv_id) is not None:
            self._refreshing = True
            self._select(conv_id)
            self._refreshing = False

    def ids(self) -> list[int]:
        return [row[0] for row in self.model.rows()]

    def current_id(self) -> int | None:
        """The chat of the list's current row, None without one."""
        index = self.list.currentIndex()
        return index.data(CONV_ROLE) if index.isValid() else None

    def rename(self, conv_id: int) -> None:
        """Opens the row's title editor."""
        row = self.model.row_of(conv_id)
        if row is not None:
            self.list.edit(self.model.index(row, 0))

    def refresh(self) -> None:
        if self.list.state() == self.list.State.EditingState:  # its row changed or gone would throw the rename away
            self._stale = True
            return
        text = self._wanted = self.search.text()
        source = self.service.message_search(text) if text.strip() else None
        if source is None:  # no search, or a store the worker cannot read: found here
            self._show(self.service.visible(text))
            return
        if self._found is not None and self._found[0] == text:  # the chats changed under this search: shown at once
            self._show(self.service.visible(text, self._found[1]))
        self._look(text, source)

    def searching(self) -> bool:
        """A search of the messages is on the worker: the list shows the last text found until it is back."""
        return self._asked is not None

    def _look(self, text: str, source: Callable[[Callable[[], bool]], set[int]]) -> None:
        if self._asked is not None:
            self._again = True
            return
        self._asked = text
        self._searcher.run(partial(source, lambda: self._wanted != text), partial(self._looked, text))

    def _looked(self, text: str, hits: set[int] | None, error: Exception | None) -> None:
        """Results are shown only for the text the box still holds; the chats as they are now."""
        self._asked = None
        again, self._again = self._again, False
        if self.search.text() != text:
            if again:
                self.refresh()
            return
        source = self.service.message_search(text) if again else None
        if error is not None and source is not None:  # stopped while the box said otherwise, back to this text since
            self._look(text, source)
            return
        self._found = (text, hits) if error is None else None
        if self.list.state() == self.list.State.EditingState:
            self._stale = True
            return
        self._show(self.service.visible(text) if error is not None else self.service.visible(text, hits))
        if source is not None:  # a chat added or changed while it looked may hold the text
            self._look(text, source)

    def _show(self, convs: list) -> None:
        """The list shows `convs`: only the rows that changed are touched, the current chat stays current."""
        self._stale = False
        answering = set(self.service.live_chats())
        seen = self._current_seen()
        self._refreshing = True  # rows removed under the current one move it: not a choice of the user's
        self.list.setAutoScroll(False)  # nor is the row the list would scroll to then
        self.model.show([(c.id, c.title, c.pinned, c.id in answering) for c in convs])
        self._select(self._current)
        self.list.setAutoScroll(True)
        self._refreshing = False
        if seen:  # the chat in use stays in sight when it moves (to the top, on its reply)
            self.list.scrollTo(self.list.currentIndex())

    def _current_seen(self) -> bool:
        index = self.list.currentIndex()
        return index.isValid() and self.list.viewport().rect().intersects(self.list.visualRect(index))

    def _select(self, conv_id: int | None) -> None:
        row = self.model.row_of(conv_id) if conv_id is not None else None
        index = self.model.index(row, 0) if row is not None else QModelIndex()
        if index != self.list.currentIndex():
            self.list.setCurrentIndex(index)

    def _after_edit(self, *_args) -> None:
        if self._stale:
            self.refresh()

    def _on_status(self, conv_id: int) -> None:
        """Every token batch of a streaming chat: its row found by id, its mark changed where busy or pinned did."""
        if self.model.row_of(conv_id) is not None and self.service.store.has(conv_id):
            self.model.set_marks(conv_id, self.service.store.get(conv_id).pinned, self.service.busy(conv_id))

    def keyPressEvent(self, event) -> None:
        conv_id = self.current_id()
        if event.key() == Qt.Key.Key_Delete and conv_id is not None and self.list.hasFocus():
            self.delete_requested.emit(conv_id)
            return
        super().keyPressEvent(event)

    def _on_current(self, index: QModelIndex, _previous) -> None:
        if index.isValid() and not self._refreshing:
            self._current = index.data(CONV_ROLE)
            self.selected.emit(self._current)

    def _on_renamed(self, conv_id: int, title: str) -> None:
        if self.service.store.has(conv_id):  # not deleted while being renamed
            self.service.rename(conv_id, title)

    def _menu(self, pos) -> None:
        index = self.list.indexAt(pos)
        if index.isValid():
            self.menu_for(index.data(CONV_ROLE)).exec(self.list.mapToGlobal(pos))

    def menu_for(self, conv_id: int) -> QMenu:
        """A row's context menu; its actions name the chat by id, as the list may change while it is open."""
        pinned = self.service.store.get(conv_id).pinned
        menu = QMenu(self)
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)  # however it closes: each right-click kept one before
        menu.addAction(self.tr("Rename"), lambda: self.rename(conv_id))
        menu.addAction(icon("pin"), self.tr("Unpin") if pinned else self.tr("Pin"),
                       lambda: self.service.set_pinned(conv_id, not pinned))
        menu.addAction(icon("delete"), self.tr("Delete"), lambda: self.delete_requested.emit(conv_id))
        return menu
