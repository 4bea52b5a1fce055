"""The chat page: title, model picker and settings button, the chat view, the status line and the composer."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from app.qt.chat_view import ChatView
from app.core.chats import ChatService
from app.qt.composer import Composer
from app.qt.model_manager import ModelManager
from app.qt.settings_dialog import ModelPicker
from app.qt.status_line import StatusLine
from app.qt.theme import icon


class ChatPage(QWidget):
    settings_requested = Signal()

    def __init__(self, service: ChatService, models: ModelManager, parent=None):
        super().__init__(parent)
        self.service, self.models = service, models
        self.conv_id: int | None = None
        self.editing: int | None = None  # the user message being edited
        self.title = QLabel(objectName="chatTitle")
        self.picker = ModelPicker(models.registry)
        self.picker.setToolTip("Model for this chat (takes effect on the next turn)")
        self.settings_button = QToolButton(icon=icon("settings"), toolTip="Chat settings (Ctrl+,)")
        self.view = ChatView(service)
        self.status = StatusLine()
        self.composer = Composer()
        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.picker)
        head.addWidget(self.settings_button)
        layout = QVBoxLayout(self)
        layout.addLayout(head)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.composer)
        self.picker.currentIndexChanged.connect(self._on_model)
        self.settings_button.clicked.connect(self.settings_requested)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop)
        self.composer.edit_cancelled.connect(self._cancel_edit)
        self.view.edit_requested.connect(self.begin_edit)
        service.status_changed.connect(self._on_status)
        service.conversations_changed.connect(self._on_titles)
        models.changed.connect(lambda _key: self._on_status(self.conv_id))

    def open(self, conv_id: int | None) -> None:
        """Switching chats only swaps the model behind the view: instant, even while chats stream."""
        self.conv_id = conv_id
        self._cancel_edit()
        self.view.set_conversation(conv_id)
        self._on_titles()
        if conv_id is not None:
            self.picker.reload(self.service.store.get(conv_id).settings.model)
        self._on_status(conv_id)

    def send(self, text: str) -> bool:
        if self.conv_id is None:
            return False
        if self.editing is not None:
            ok = self.service.edit(self.editing, text)
        else:
            ok = self.service.send(self.conv_id, text)
        if ok:
            self.composer.edit.clear()
            self._cancel_edit()
        return ok

    def stop(self) -> None:
        if self.conv_id is not None:
            self.service.stop(self.conv_id)

    def begin_edit(self, msg_id: int) -> None:
        self.editing = msg_id
        self.composer.begin_edit(self.service.store.message(msg_id).content)

    def _cancel_edit(self) -> None:
        self.editing = None
        self.composer.end_edit()

    def _on_model(self, *_args) -> None:
        if self.conv_id is not None:
            settings = self.service.store.get(self.conv_id).settings
            self.service.set_settings(self.conv_id, settings.copy(model=self.picker.key()))

    def _on_titles(self) -> None:
        ok = self.conv_id is not None and self.service.store.has(self.conv_id)
        self.title.setText(self.service.store.get(self.conv_id).title if ok else "")

    def _on_status(self, conv_id: int | None) -> None:
        if conv_id is None or conv_id != self.conv_id or not self.service.store.has(conv_id):
            return
        key = self.service.store.get(conv_id).settings.model
        state = self.models.state(key)
        loading = ""
        if state is not None and state.status == "loading":
            loading = f"loading {state.stage} {state.fraction:.0%}"
        elif state is not None and state.status == "failed":
            loading = "failed to load"
        status = self.service.status(conv_id)
        if not status.model and state is not None:
            status.model = state.name or state.entry.name
        self.status.show_status(status, loading)
        self.composer.set_busy(self.service.busy(conv_id))
