"""The sidebar: new chat, search by title and text, the list of chats (pinned first) with rename/pin/delete."""
from __future__ import annotations

from functools import partial
from typing import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QLineEdit, QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget

from app.core.chats import ChatService
from app.qt.background import Background
from app.qt.theme import icon

CONV_ROLE = Qt.ItemDataRole.UserRole
MARK_ROLE = Qt.ItemDataRole.UserRole + 1  # which icon the item shows: "busy", "pin" or ""


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
        self.list = QListWidget(objectName="sidebarList")
        self.list.setAccessibleName(self.tr("Chats"))
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        # one-line rows of one height: without this every change measured every row (two Python style calls each,
        # 60 ms for 3,000 chats when a new chat was selected)
        self.list.setUniformItemSizes(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        self._current: int | None = None
        self._rows: dict[int, QListWidgetItem] = {}  # conversation -> its row's item, as the last refresh left them
        self._refreshing = False
        self._stale = False  # a refresh waits for the rename editor to close
        # a search of the messages runs on a worker (on the GUI thread each keystroke of a common phrase in 3,000 chats
        # froze the window 50-70 ms), one at a time: typed on meanwhile, the latest text is looked for once it is back
        self._searcher = Background(self)
        self._asked: str | None = None  # the text the worker looks for now
        self._wanted = ""  # the text in the box, as the worker reads it (a search for another one stops)
        self._again = False  # the text or the chats changed while it looked
        self._found: tuple[str, set[int]] | None = None  # the last text found and the chats whose messages hold it
        self._shown: tuple | None = None  # what the rows show: (id, title, pinned, answering) of each, the current chat
        self.new_button.clicked.connect(self.new_requested)
        self.search.textChanged.connect(self.refresh)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemChanged.connect(self._on_renamed)
        self.list.itemDelegate().closeEditor.connect(self._after_edit)
        self.list.customContextMenuRequested.connect(self._menu)
        service.conversations_changed.connect(self.refresh)
        service.status_changed.connect(self._on_status)
        self._icons = {"pin": icon("pin"), "busy": icon("streaming", "#3b82f6")}
        self.refresh()  # the chats already in the store (a restart): the list is never empty while they exist

    def set_current(self, conv_id: int | None) -> None:
        self._current = conv_id
        item = self._rows.get(conv_id)
        if item is not None:
            self._refreshing = True
            self.list.setCurrentItem(item)
            self._refreshing = False

    def ids(self) -> list[int]:
        return [self.list.item(i).data(CONV_ROLE) for i in range(self.list.count())]

    def refresh(self) -> None:
        if self.list.state() == self.list.State.EditingState:  # clearing the list would throw the rename away
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
        self._stale = False
        answering = set(self.service.live_chats())
        # a search back with the list already shown (chats, titles, marks): its 3,000 rows walked for nothing, 12-26 ms
        shown = [(c.id, c.title, c.pinned, c.id in answering) for c in convs], self._current
        if shown == self._shown:
            return
        self._shown = shown
        self._refreshing = True
        # rows are kept, moved or added one by one, not cleared and rebuilt: a refresh (every new chat, delete, rename
        # or search keystroke) rebuilt every row: 26-36 ms for 1,000 chats, 6 ms kept
        listed = {conv.id for conv in convs}
        for row in reversed(range(self.list.count())):  # first the rows of chats gone: the others need not move for them
            if self.list.item(row).data(CONV_ROLE) not in listed:
                self.list.takeItem(row)
        items = {item.data(CONV_ROLE): item for item in map(self.list.item, range(self.list.count()))}
        current, rows = None, {}
        for row, conv in enumerate(convs):
            item = self._row_for(row, conv, items, conv.id in answering)
            if item.text() != conv.title:
                item.setText(conv.title)
                item.setToolTip(conv.title)
                item.setData(MARK_ROLE, None)  # its accessible name holds the title: set again below
            self._mark(item, conv, conv.id in answering)
            rows[conv.id] = item
            if conv.id == self._current:
                current = item
        self._rows = rows
        if current is not None:
            self.list.setCurrentItem(current)
        else:
            self.list.setCurrentRow(-1)
        self._refreshing = False

    def _row_for(self, row: int, conv, items: dict[int, QListWidgetItem], busy: bool) -> QListWidgetItem:
        """The item of `conv`, at `row`: the one there, one moved up from further down (a chat that became the
        latest), or a new one, filled before it goes in (each field set in the list is a signal and a repaint)."""
        item = self.list.item(row)
        if item is not None and item.data(CONV_ROLE) == conv.id:
            return item
        moved = items.get(conv.id)
        if moved is not None:
            self.list.takeItem(self.list.row(moved))
        else:
            moved = QListWidgetItem(conv.title)
            moved.setToolTip(conv.title)
            moved.setData(CONV_ROLE, conv.id)
            moved.setFlags(moved.flags() | Qt.ItemFlag.ItemIsEditable)
            self._mark(moved, conv, busy)
        self.list.insertItem(row, moved)
        return moved

    def _after_edit(self, *_args) -> None:
        if self._stale:
            self.refresh()

    def _mark(self, item: QListWidgetItem, conv=None, busy: bool | None = None) -> None:
        """Busy and pinned show as icons (an emoji is a box without an emoji font) and in the accessible name.
        `conv` and `busy`: the item's chat and whether it answers, where the caller knows them."""
        conv = conv or self.service.store.get(item.data(CONV_ROLE))
        busy = self.service.busy(conv.id) if busy is None else busy
        state = "busy" if busy else "pin" if conv.pinned else ""
        if item.data(MARK_ROLE) == state:
            return
        was, self._refreshing = self._refreshing, True
        item.setData(MARK_ROLE, state)
        item.setIcon(self._icons[state] if state else QIcon())
        notes = [self.tr("answering") if busy else "", self.tr("pinned") if conv.pinned else ""]
        item.setData(Qt.ItemDataRole.AccessibleTextRole, ", ".join([conv.title, *filter(None, notes)]))
        self._refreshing = was

    def _on_status(self, conv_id: int) -> None:
        """Every token batch of a streaming chat: its row found by id (a walk over 3,000 rows took 3.5-3.9 ms)."""
        item = self._rows.get(conv_id)
        if item is not None and self.service.store.has(conv_id):
            self._mark(item)

    def keyPressEvent(self, event) -> None:
        item = self.list.currentItem()
        if event.key() == Qt.Key.Key_Delete and item is not None and self.list.hasFocus():
            self.delete_requested.emit(item.data(CONV_ROLE))
            return
        super().keyPressEvent(event)

    def _on_current(self, item: QListWidgetItem | None, _previous) -> None:
        if item is not None and not self._refreshing:
            self._current = item.data(CONV_ROLE)
            self.selected.emit(self._current)

    def _on_renamed(self, item: QListWidgetItem) -> None:
        if self._refreshing or not self.service.store.has(item.data(CONV_ROLE)):  # deleted while being renamed
            return
        self._shown = None  # the row holds what was typed, which the title may not be ("Foo " is "Foo")
        self.service.rename(item.data(CONV_ROLE), item.text())

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        conv_id = item.data(CONV_ROLE)
        pinned = self.service.store.get(conv_id).pinned
        menu = QMenu(self)
        menu.addAction(self.tr("Rename"), lambda: self.list.editItem(item))
        menu.addAction(icon("pin"), self.tr("Unpin") if pinned else self.tr("Pin"),
                       lambda: self.service.set_pinned(conv_id, not pinned))
        menu.addAction(icon("delete"), self.tr("Delete"), lambda: self.delete_requested.emit(conv_id))
        menu.exec(self.list.mapToGlobal(pos))
