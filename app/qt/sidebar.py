"""The sidebar: new chat, search by title and text, the list of chats (pinned first) with rename/pin/delete."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLineEdit, QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget

from app.core.chats import ChatService
from app.qt.theme import icon

CONV_ROLE = Qt.ItemDataRole.UserRole


class Sidebar(QWidget):
    selected = Signal(int)  # conversation
    new_requested = Signal()

    def __init__(self, service: ChatService, parent=None):
        super().__init__(parent, objectName="sidebar")
        self.service = service
        self.new_button = QPushButton(icon("new"), "New chat")
        self.search = QLineEdit(placeholderText="Search chats…", clearButtonEnabled=True)
        self.list = QListWidget(objectName="sidebarList")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        self._current: int | None = None
        self._refreshing = False
        self.new_button.clicked.connect(self.new_requested)
        self.search.textChanged.connect(self.refresh)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemChanged.connect(self._on_renamed)
        self.list.customContextMenuRequested.connect(self._menu)
        service.conversations_changed.connect(self.refresh)
        service.status_changed.connect(self._on_status)

    def set_current(self, conv_id: int | None) -> None:
        self._current = conv_id
        for i in range(self.list.count()):
            if self.list.item(i).data(CONV_ROLE) == conv_id:
                self._refreshing = True
                self.list.setCurrentRow(i)
                self._refreshing = False

    def ids(self) -> list[int]:
        return [self.list.item(i).data(CONV_ROLE) for i in range(self.list.count())]

    def refresh(self) -> None:
        self._refreshing = True
        self.list.clear()
        for conv in self.service.store.search(self.search.text()):
            item = QListWidgetItem(self._label(conv.id))
            item.setData(CONV_ROLE, conv.id)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            item.setToolTip(conv.title)
            self.list.addItem(item)
            if conv.id == self._current:
                self.list.setCurrentItem(item)
        self._refreshing = False

    def _label(self, conv_id: int) -> str:
        conv = self.service.store.get(conv_id)
        marks = ("📌 " if conv.pinned else "") + ("● " if self.service.busy(conv_id) else "")
        return marks + conv.title

    def _on_status(self, conv_id: int) -> None:
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(CONV_ROLE) == conv_id and self.service.store.has(conv_id):
                label = self._label(conv_id)
                if item.text() != label:
                    self._refreshing = True
                    item.setText(label)
                    self._refreshing = False

    def _on_current(self, item: QListWidgetItem | None, _previous) -> None:
        if item is not None and not self._refreshing:
            self._current = item.data(CONV_ROLE)
            self.selected.emit(self._current)

    def _on_renamed(self, item: QListWidgetItem) -> None:
        if self._refreshing:
            return
        title = item.text().replace("📌 ", "").replace("● ", "")
        self.service.rename(item.data(CONV_ROLE), title)

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        conv_id = item.data(CONV_ROLE)
        pinned = self.service.store.get(conv_id).pinned
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.editItem(item))
        menu.addAction(icon("pin"), "Unpin" if pinned else "Pin", lambda: self.service.set_pinned(conv_id, not pinned))
        menu.addAction(icon("delete"), "Delete", lambda: self.service.delete(conv_id))
        menu.exec(self.list.mapToGlobal(pos))
