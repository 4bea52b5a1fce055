"""Compare view: one prompt box sending to 2–4 columns, each with its own model/settings and its own history."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox, QFrame, QHBoxLayout, QLabel, QPushButton, QSpinBox, QToolButton, QVBoxLayout, QWidget,
)

from app.qt.chat_view import ChatView
from app.core.chats import ChatService
from app.qt.composer import Composer
from app.qt.model_manager import ModelManager
from app.qt.settings_dialog import ModelPicker, SettingsDialog
from app.qt.status_line import describe
from app.qt.theme import icon

MAX_COLUMNS = 4


class CompareColumn(QFrame):
    """One column: a hidden conversation shown with its own chat view, model picker and speed line."""

    promote_requested = Signal(object)

    def __init__(self, service: ChatService, models: ModelManager, conv_id: int, parent=None):
        super().__init__(parent, objectName="compareColumn")
        self.service, self.models, self.conv_id = service, models, conv_id
        self.picker = ModelPicker(models.registry)
        self.settings_button = QToolButton(icon=icon("settings"), toolTip="Sampling settings for this column")
        self.promote_button = QPushButton("Make chat", toolTip="Move this column to the sidebar as a normal chat")
        self.view = ChatView(service)
        self.stats = QLabel(objectName="statusText")
        self.stats.setWordWrap(True)
        head = QHBoxLayout()
        head.addWidget(self.picker, 1)
        head.addWidget(self.settings_button)
        head.addWidget(self.promote_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(head)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.stats)
        self.picker.currentIndexChanged.connect(self._on_model)
        self.settings_button.clicked.connect(self.edit_settings)
        self.promote_button.clicked.connect(lambda: self.promote_requested.emit(self))
        service.status_changed.connect(self._on_status)
        self.attach(conv_id)

    def attach(self, conv_id: int) -> None:
        self.conv_id = conv_id
        self.picker.reload(self.service.store.get(conv_id).settings.model)
        self.view.set_conversation(conv_id)
        self._on_status(conv_id)

    def set_model(self, key: str) -> None:
        self.picker.reload(key)
        self._on_model()

    def edit_settings(self) -> None:
        conv = self.service.store.get(self.conv_id)
        dialog = SettingsDialog(self.models.registry, conv.settings, "Column settings", self, offer_default=False)
        if dialog.exec():
            self.service.set_settings(self.conv_id, dialog.settings())
            self.picker.reload(dialog.settings().model)

    def _on_model(self, *_args) -> None:
        settings = self.service.store.get(self.conv_id).settings
        self.service.set_settings(self.conv_id, settings.copy(model=self.picker.key()))

    def _on_status(self, conv_id: int) -> None:
        if conv_id == self.conv_id and self.service.store.has(conv_id):
            s = self.service.status(conv_id)
            state = self.models.state(self.service.store.get(conv_id).settings.model)
            loading = f"loading {state.fraction:.0%}" if state and state.status == "loading" else ""
            self.stats.setText(describe(s, loading))


class CompareView(QWidget):
    promoted = Signal(int)  # the conversation that became a normal chat

    def __init__(self, service: ChatService, models: ModelManager, one_at_a_time: bool = False, parent=None):
        super().__init__(parent)
        self.service, self.models = service, models
        self.columns: list[CompareColumn] = []
        self._queue: list[tuple[CompareColumn, str]] = []  # one-at-a-time mode: columns still to answer
        self.count = QSpinBox(minimum=2, maximum=MAX_COLUMNS, value=2, prefix="Columns: ")
        self.one_at_a_time = QCheckBox("One at a time", checked=one_at_a_time,
                                       toolTip="Columns answer in turn instead of together (for small machines)")
        self.clear_button = QPushButton(icon("new"), "New comparison")
        bar = QHBoxLayout()
        bar.addWidget(QLabel("<b>Compare</b>"))
        bar.addStretch(1)
        bar.addWidget(self.count)
        bar.addWidget(self.one_at_a_time)
        bar.addWidget(self.clear_button)
        self.row = QHBoxLayout()
        self.composer = Composer("One prompt for every column — Enter sends")
        layout = QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addLayout(self.row, 1)
        layout.addWidget(self.composer)
        self.count.valueChanged.connect(self.set_columns)
        self.clear_button.clicked.connect(self.clear)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop)
        service.turn_done.connect(self._on_turn_done)
        service.status_changed.connect(self._on_status)
        self.set_columns(2)

    def set_columns(self, n: int) -> None:
        while len(self.columns) < n:
            settings = self.service.defaults
            column = CompareColumn(self.service, self.models, self.service.new_conversation(settings, hidden=True))
            column.promote_requested.connect(self.promote)
            self.columns.append(column)
            self.row.addWidget(column, 1)
        while len(self.columns) > n:
            column = self.columns.pop()
            column.view.set_conversation(None)
            self.service.delete(column.conv_id)
            column.deleteLater()
        if self.count.value() != n:
            self.count.setValue(n)

    def busy(self) -> bool:
        return bool(self._queue) or any(self.service.busy(c.conv_id) for c in self.columns)

    def send(self, text: str) -> bool:
        """The prompt (or follow-up) goes to every column."""
        if not text.strip() or self.busy():
            return False
        self.composer.edit.clear()
        if self.one_at_a_time.isChecked():
            self._queue = [(c, text) for c in self.columns[1:]]
            self.service.send(self.columns[0].conv_id, text)
        else:
            for column in self.columns:
                self.service.send(column.conv_id, text)
        self._on_status(self.columns[0].conv_id)
        return True

    def stop(self) -> None:
        self._queue.clear()
        for column in self.columns:
            self.service.stop(column.conv_id)

    def clear(self) -> None:
        """Fresh, empty columns with the same settings."""
        self.stop()
        for column in self.columns:
            old = column.conv_id
            column.attach(self.service.new_conversation(self.service.store.get(old).settings, hidden=True))
            self.service.delete(old)

    def promote(self, column: CompareColumn) -> None:
        conv_id = column.conv_id
        settings = self.service.store.get(conv_id).settings
        self.service.promote(conv_id)
        column.attach(self.service.new_conversation(settings, hidden=True))
        self.promoted.emit(conv_id)

    def _on_turn_done(self, conv_id: int, _msg_id: int) -> None:
        if self._queue and not any(self.service.busy(c.conv_id) for c in self.columns):
            column, text = self._queue.pop(0)
            self.service.send(column.conv_id, text)

    def _on_status(self, conv_id: int) -> None:
        if any(c.conv_id == conv_id for c in self.columns):
            self.composer.set_busy(self.busy())
