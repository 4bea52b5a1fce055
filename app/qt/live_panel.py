"""The live panel: every generation running now (chat, model, state, tok/s); open a chat from it or stop it."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QDockWidget, QHBoxLayout, QHeaderView, QStyledItemDelegate, QToolButton, QTreeWidget, QTreeWidgetItem, QVBoxLayout,
    QWidget,
)

from app.core.chats import ChatService
from app.core.comparison import column_letters
from app.qt.status_line import phase
from app.qt.theme import icon

REFRESH_MS = 250  # a few updates a second: rates move, and the panel never costs a repaint per token
CONV_ROLE = Qt.ItemDataRole.UserRole
MODEL_COLUMN = 1
READABLE_CHARS = 12  # Chat and Model keep about this many characters when the panel gives way ("Why is th…")


class MiddleElided(QStyledItemDelegate):
    """A model's name cut in the middle, as the pickers cut it: its end tells quantizations apart (at 800 px the
    column holds ~12 characters, and 'bartowski/Qwen2.5-7B-Instruct-GGUF · …-Q4_K_M' and its Q8_0 both read
    'bartowski/…')."""

    def initStyleOption(self, option, index) -> None:  # noqa: N802 - Qt's name
        super().initStyleOption(option, index)
        option.textElideMode = Qt.TextElideMode.ElideMiddle


class LivePanel(QDockWidget):
    open_requested = Signal(int)  # conversation
    stopping_all = Signal()  # Stop all, before the chats stop: a comparison's columns still to answer must not start

    def __init__(self, service: ChatService, parent=None):
        super().__init__(self.tr("Live generations"), parent, objectName="livePanel")
        self.service = service
        self.table = QTreeWidget(rootIsDecorated=False, uniformRowHeights=True)
        self.table.setHeaderLabels([self.tr("Chat"), self.tr("Model"), self.tr("State"), self.tr("tok/s")])
        header = self.table.header()
        header.setStretchLastSection(False)
        for column in (0, 1):  # the chat's title and the model's name share what is left, elided if need be
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Stretch)
        for column in (2, 3):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.table.setItemDelegateForColumn(MODEL_COLUMN, MiddleElided(self.table))
        self.table.setAccessibleName(self.tr("Live generations"))
        # compact buttons: the dock must fit beside a chat in a small window without widening it
        self.open_button = QToolButton(text=self.tr("Open"))
        self.stop_button = QToolButton(icon=icon("stop"), text=self.tr("Stop"))
        self.stop_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.stop_all_button = QToolButton(text=self.tr("Stop all"))
        buttons = QHBoxLayout()
        for b in (self.open_button, self.stop_button, self.stop_all_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)
        self.setWidget(body)
        self._timer = QTimer(self, interval=REFRESH_MS)
        self._timer.timeout.connect(self.refresh)
        self.table.itemActivated.connect(lambda item, _col: self.open_requested.emit(item.data(0, CONV_ROLE)))
        self.open_button.clicked.connect(self._open_selected)
        self.stop_button.clicked.connect(self._stop_selected)
        self.stop_all_button.clicked.connect(self.stop_all)
        service.status_changed.connect(self._wake)
        self.visibilityChanged.connect(lambda shown: self.refresh() if shown else self._timer.stop())
        self.refresh()

    def rows(self) -> list[tuple[int, str, str, str, str]]:
        """(conversation, chat, model, state, tok/s) for every chat answering or waiting to; the state in a word (its
        cell's tooltip has it whole): 'reading the prompt (812 tokens) · 4 s' took half an 800 px window's panel,
        leaving Chat and Model 40 px and tok/s out of sight."""
        out = []
        store = self.service.store
        # four columns of one model read alike ("Compare column: hello" four times); the letter first, where a narrow
        # panel's cell still shows it ("A · Compare: h…")
        letters = column_letters(store)
        for conv_id in self.service.live_chats():
            conv = store.get(conv_id)
            s = self.service.status(conv_id)
            title = conv.title if not conv.hidden else (
                self.tr("%1 · Compare: %2").replace("%1", letters.get(conv_id, "?")).replace("%2", conv.title))
            state = phase(s, brief=True) or s.state
            rate = f"{s.tokens_per_s:.1f}" if s.tokens_per_s else "—"
            out.append((conv_id, title, s.model or self._model_name(conv.settings.model), state, rate))
        return out

    def _model_name(self, key: str) -> str:
        """The name the picker shows (a chat waiting for its model has no name from the engine yet; the key is a path)."""
        entry = self.service.models.registry.get(key)
        return entry.name if entry is not None else key

    def refresh(self) -> None:
        rows = self.rows()
        selected = self._selected()
        self.table.setUpdatesEnabled(False)
        self.table.clear()
        for conv_id, *cells in rows:
            item = QTreeWidgetItem(cells)
            item.setData(0, CONV_ROLE, conv_id)
            for column in (0, 1):
                item.setToolTip(column, cells[column])  # the whole of a title or name elided in its cell
            item.setToolTip(2, phase(self.service.status(conv_id)) or cells[2])
            item.setTextAlignment(3, Qt.AlignmentFlag.AlignRight)
            self.table.addTopLevelItem(item)
            if conv_id == selected:
                self.table.setCurrentItem(item)
        self.table.setUpdatesEnabled(True)
        self._least_width()
        self.setWindowTitle(self.tr("Live generations (%1)").replace("%1", str(len(rows))))
        for b in (self.open_button, self.stop_button, self.stop_all_button):
            b.setEnabled(bool(rows))
        if not rows:
            self._timer.stop()

    def _least_width(self) -> None:
        """The panel narrows (to leave a small window's chat its title) down to State and tok/s whole and Chat and Model
        READABLE_CHARS wide: no narrower, or those columns went out of sight (at their headings' width, an 800 px
        window's panel read 'Why…' and 'q…f')."""
        header, least = self.table.header(), self.table.fontMetrics().averageCharWidth() * READABLE_CHARS
        cells = [max(header.sectionSizeHint(c), self.table.sizeHintForColumn(c) if c > 1 else least) for c in range(4)]
        self.table.setMinimumWidth(sum(cells) + 2 * self.table.frameWidth())

    def stop_all(self) -> None:
        self.stopping_all.emit()
        for conv_id in self.service.live_chats():
            self.service.stop(conv_id)

    def _wake(self, _conv_id: int) -> None:
        if self.isVisible() and not self._timer.isActive():
            self.refresh()
            self._timer.start()

    def _selected(self) -> int | None:
        item = self.table.currentItem()
        return item.data(0, CONV_ROLE) if item is not None else None

    def _open_selected(self) -> None:
        if self._selected() is not None:
            self.open_requested.emit(self._selected())

    def _stop_selected(self) -> None:
        if self._selected() is not None:
            self.service.stop(self._selected())
