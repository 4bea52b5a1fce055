"""The chat page: title, model picker and settings button, the chat view, the status line and the composer."""
from __future__ import annotations

import html
from dataclasses import replace

from PySide6.QtCore import Signal
from PySide6.QtGui import QFont, QPalette, QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QStackedWidget, QToolButton, QVBoxLayout, QWidget

from app.core.chats import ChatService
from app.core.live import ChatStatus
from app.core.message_html import NOTE_COLOR
from app.qt.chat_view import ChatView
from app.qt.composer import Composer, LinkNote
from app.qt.elided_label import ElidedLabel
from app.qt.empty_state import EmptyState
from app.qt.model_manager import ModelManager
from app.qt.settings_dialog import ModelPicker
from app.qt.status_line import StatusLine
from app.qt.theme import icon

TITLE_CHARS = 16  # the title keeps room for this many characters whatever sits beside it (a Live panel took it all)
PICKER_CHARS = 14  # the model picker gives way down to this many, before the title does


def scaled(font: QFont, factor: float) -> QFont:
    """`font` `factor` times larger, whether it is sized in points or in pixels."""
    out = QFont(font)
    if font.pointSizeF() > 0:
        out.setPointSizeF(font.pointSizeF() * factor)
    else:
        out.setPixelSize(round(font.pixelSize() * factor))
    return out


class ChatPage(QWidget):
    settings_requested = Signal()
    resized = Signal()

    def __init__(self, service: ChatService, models: ModelManager, parent=None):
        super().__init__(parent)
        self.service, self.models = service, models
        self.conv_id: int | None = None
        self.editing: int | None = None  # the user message being edited
        self.title = ElidedLabel(objectName="chatTitle")  # a long title elides, never widens the window
        self.title.setFont(scaled(self.title.font(), 1.15))  # a step above the text at any font size (was 15 px)
        self.title.setMinimumWidth(self.title.fontMetrics().averageCharWidth() * TITLE_CHARS)
        self.picker = ModelPicker(models.registry)
        self.picker.setMinimumWidth(self.picker.fontMetrics().averageCharWidth() * PICKER_CHARS)
        self.picker.setToolTip(self.tr("Model for this chat (takes effect on the next turn)"))
        self.picker.setAccessibleName(self.tr("Model for this chat"))
        self.settings_button = QToolButton(icon=icon("settings"), toolTip=self.tr("Chat settings (Ctrl+,)"))
        self.settings_button.setAccessibleName(self.tr("Chat settings"))
        self.view = ChatView(service)
        self.empty = EmptyState()
        self.body = QStackedWidget()
        self.body.addWidget(self.view)
        self.body.addWidget(self.empty)
        self.status = StatusLine()
        config = models.bridge.engine.config
        self.status.capacity = (config.max_sessions, config.max_session_tokens)
        self.queued = LinkNote(objectName="queuedNote")  # "Back to the box" by mouse or keyboard
        self.queued.hide()
        self.refused_note = LinkNote(objectName="refusedNote")  # why the message just sent is back in the box
        self.refused_note.hide()
        self.composer = Composer()
        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.picker)
        head.addWidget(self.settings_button)
        layout = QVBoxLayout(self)
        layout.addLayout(head)
        layout.addWidget(self.body, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.queued)
        layout.addWidget(self.refused_note)
        layout.addWidget(self.composer)
        self.picker.currentIndexChanged.connect(self._on_model)
        self.settings_button.clicked.connect(self.settings_requested)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop)
        self.composer.edit_cancelled.connect(self._cancel_edit)
        self.view.edit_requested.connect(self.begin_edit)
        self.composer.edit.textChanged.connect(self._keep_draft)
        self.empty.prompt_chosen.connect(self._use_sample)
        self.queued.linkActivated.connect(self._unqueue)
        self.refused_note.linkActivated.connect(self._dismiss_refusal)
        service.refused.connect(self._on_refused)
        service.draft_changed.connect(self._on_draft)
        service.path_changed.connect(self._on_status)
        service.status_changed.connect(self._on_status)
        service.conversations_changed.connect(self._on_titles)
        service.settings_changed.connect(self._on_settings)  # set elsewhere (a window's dialog, a model removed)
        models.changed.connect(self._on_models_changed)  # bound: it stops with the page, a lambda would not
        models.own_name_known.connect(self._on_models_changed)  # an answer's model named as listed from now on

    def comfortable_width(self) -> int:
        """The width at which the title has its least room beside a whole model picker: a window's side panel gives
        way before the page is narrower."""
        return self.minimumSizeHint().width() + max(0, self.picker.sizeHint().width() - self.picker.minimumWidth())

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self.resized.emit()

    def open(self, conv_id: int | None) -> None:
        """Switching chats only swaps the model behind the view: instant, even while chats stream."""
        self._leave_edit()  # the service keeps it (keep_edit at every keystroke): it opens again on return
        self.conv_id = conv_id
        self._on_draft(conv_id)
        self._reopen_edit(conv_id)
        self.view.set_conversation(conv_id)
        self._on_titles()
        if conv_id is not None:
            key = self.service.store.get(conv_id).settings.model
            self.picker.reload(key)
            self.models.ensure(key)  # warm the chat's model while the user reads and types
        self._on_status(conv_id)

    def send(self, text: str) -> bool:
        if self.conv_id is None:
            return False
        if self.editing is not None:
            ok = self.service.edit(self.editing, text)
        else:
            ok = self.service.send_or_queue(self.conv_id, text)  # while it answers: sent next, shown queued
        if ok:
            was_editing = self.editing is not None
            self._cancel_edit()
            if not was_editing:
                self.composer.edit.clear()
            self.view.follow()  # the message just sent is on screen, however far up the user had scrolled
        return ok

    def stop(self) -> None:
        if self.conv_id is not None:
            self.service.stop(self.conv_id)

    def begin_edit(self, msg_id: int, text: str | None = None) -> None:
        """Opens an earlier message for editing (with `text`: an edit in progress, as it was left)."""
        self.editing = msg_id  # the draft stays in the service while the box holds the message being edited
        self.composer.begin_edit(self.service.store.message(msg_id).content if text is None else text)
        self.composer.edit.moveCursor(QTextCursor.MoveOperation.End)

    def _cancel_edit(self) -> None:
        """The edit sent or given up: the service forgets it (and a refusal of it goes too)."""
        editing = self.editing
        self._leave_edit()
        if editing is not None and self.conv_id is not None:
            self.service.drop_edit(self.conv_id)
            refusal = self.service.refusal(self.conv_id)
            if refusal is not None and refusal.edit_of == editing:  # the refused edit given up
                self.service.dismiss_refusal(self.conv_id)

    def _leave_edit(self) -> None:
        """The box back to the chat's draft; the service keeps the edit."""
        editing, self.editing = self.editing, None
        self.composer.end_edit()
        if editing is not None:
            self._on_draft(self.conv_id)

    def _reopen_edit(self, conv_id: int | None) -> None:
        edit = self.service.open_edit(conv_id) if conv_id is not None else None
        if edit is not None:
            self.begin_edit(*edit)

    def _keep_draft(self) -> None:
        if self.conv_id is None:
            return
        if self.editing is not None:
            self.service.keep_edit(self.conv_id, self.editing, self.composer.edit.toPlainText())
        else:
            self.service.set_draft(self.conv_id, self.composer.edit.toPlainText())

    def _on_draft(self, conv_id: int | None) -> None:
        if conv_id == self.conv_id and self.editing is None:
            text = self.service.draft(conv_id) if conv_id is not None else ""
            if self.composer.edit.toPlainText() != text:
                self.composer.edit.setPlainText(text)
                self.composer.edit.moveCursor(QTextCursor.MoveOperation.End)

    def _on_refused(self, conv_id: int) -> None:
        """A refused edit opens again as the edit it was (a refused message is in the draft already)."""
        if conv_id == self.conv_id and self.editing is None:
            self._reopen_edit(conv_id)

    def _show_refusal(self, conv_id: int) -> None:
        refusal = self.service.refusal(conv_id)
        if refusal is not None:
            color = NOTE_COLOR["error"][self.palette().color(QPalette.ColorRole.Window).lightness() < 128]
            what = self.tr("The edit") if refusal.edit_of is not None else self.tr("The message")
            self.refused_note.setText(
                self.tr('<span style="color:%1"><b>Not sent:</b> %2</span> %3 is back in the box. '
                        '<a href="dismiss:">Dismiss</a>').replace("%1", color)
                .replace("%2", html.escape(refusal.reason)).replace("%3", what))
        self.refused_note.setVisible(refusal is not None)

    def _dismiss_refusal(self, _href: str = "") -> None:
        if self.conv_id is not None:
            self.service.dismiss_refusal(self.conv_id)

    def _unqueue(self, _href: str = "") -> None:
        if self.conv_id is not None:
            self.service.unqueue(self.conv_id)

    def _show_queued(self, conv_id: int) -> None:
        waiting = self.service.queued(conv_id)
        if waiting:
            first = html.escape(" ".join(waiting[0].split())[:80])
            more = self.tr(" and %n more", "", len(waiting) - 1) if len(waiting) > 1 else ""
            self.queued.setText(self.tr("Queued: “%1”%2 — sends when this answer ends. <a href=\"unqueue:\">Back to the box</a>")
                                .replace("%1", first).replace("%2", more))
        self.queued.setVisible(bool(waiting))

    def _on_model(self, *_args) -> None:
        if self.conv_id is not None:
            settings = self.service.store.get(self.conv_id).settings
            self.service.set_settings(self.conv_id, settings.copy(model=self.picker.key()))

    def _on_settings(self, conv_id: int) -> None:
        """The picker names the chat's model, whoever set it: it kept naming the model before."""
        if conv_id == self.conv_id and self.service.store.has(conv_id):
            self.picker.follow(self.service.store.get(conv_id).settings.model)

    def _on_titles(self) -> None:
        ok = self.conv_id is not None and self.service.store.has(self.conv_id)
        self.title.setText(self.service.store.get(self.conv_id).title if ok else "")

    def _on_models_changed(self, _key: str) -> None:
        self._on_status(self.conv_id)

    def _on_status(self, conv_id: int | None) -> None:
        if conv_id is None or conv_id != self.conv_id or not self.service.store.has(conv_id):
            return
        key = self.service.store.get(conv_id).settings.model
        state = self.models.state(key)
        loading = ""
        if state is not None and state.status == "loading":
            done = f" {state.fraction:.0%}" if state.fraction > 0 else ""
            loading = self.tr("loading: %1").replace("%1", (state.stage or self.tr("starting")) + done)
        elif state is not None and state.status == "failed":
            loading = self.tr("failed to load")
        elif state is None and not self.service.busy(conv_id):  # unloaded (Models, or the engine's own caller)
            loading = self.tr("not loaded: loads when you send")
        self.status.show_status(self._named(conv_id, key, loading), loading)
        self.composer.set_busy(self.service.busy(conv_id))
        self._show_queued(conv_id)
        self._show_refusal(conv_id)
        self._show_body(conv_id, key)

    def _named(self, conv_id: int, key: str, loading: str) -> ChatStatus:
        """The chat's status, naming the model a load (or its absence) is about: a model picked after an answer read
        'qwen3-f32.gguf · loading: Preparing · 46.6 tok/s' while llama loaded. A turn under way keeps its model."""
        status = self.service.status(conv_id)
        entry = self.models.registry.get(key)
        listed = entry.name if entry is not None else status.model
        answering = self.service.busy(conv_id) and status.state != "loading"  # not a turn waiting for this load
        if status.model and (not loading or answering or status.model == listed):
            return status
        # a copy (the service's status is not ours to change), without figures that were another model's
        return replace(status, model=listed, tokens_per_s=None, ttft_s=None, tokens_per_step=None, prompt_tokens=0,
                       prefilled_tokens=0)

    def _show_body(self, conv_id: int, key: str) -> None:
        """An empty chat shows what model answers and prompts to start from; any message shows the chat."""
        empty = self.view.model().rowCount() == 0 and not self.service.busy(conv_id)
        if empty:
            self.empty.show_for(self.models.registry.get(key))
        self.body.setCurrentWidget(self.empty if empty else self.view)

    def _use_sample(self, prompt: str) -> None:
        self.composer.edit.setPlainText(prompt)
        self.composer.edit.moveCursor(QTextCursor.MoveOperation.End)
        self.composer.edit.setFocus()
