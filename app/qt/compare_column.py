"""One compare column: a hidden conversation with its own chat view, model picker, settings and speed line."""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QSizePolicy, QToolButton, QVBoxLayout

from app.core.chats import ChatService
from app.core.live import ChatStatus
from app.core.presets import Presets
from app.qt.chat_view import ChatView
from app.qt.elided_label import ElidedLabel
from app.qt.model_manager import ModelManager
from app.qt.settings_dialog import ModelPicker, SettingsDialog, thinking_switch_of
from app.qt.status_line import SecondsTicker, describe, shorter
from app.qt.theme import icon

# narrower and a column's answer wraps every few words; two still fit beside the sidebar of an 800 px window
COLUMN_MIN_WIDTH = 250
NARROW_TEXT = 400  # px of an answer's text width below which its links go under its model's name


class CompareColumn(QFrame):
    """One column: a hidden conversation shown with its own chat view, model picker and speed line."""

    promote_requested = Signal(object)
    close_requested = Signal(object)

    def __init__(self, service: ChatService, models: ModelManager, conv_id: int, parent=None,
                 presets: Presets | None = None):
        super().__init__(parent, objectName="compareColumn")
        self.service, self.models, self.conv_id, self.presets = service, models, conv_id, presets
        self.letter = ""
        self.setMinimumWidth(COLUMN_MIN_WIDTH)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.label = ElidedLabel(objectName="columnLabel")  # long labels elide, never widen
        self.picker = ModelPicker(models.registry)
        self.picker.setSizeAdjustPolicy(ModelPicker.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.picker.setMinimumContentsLength(8)
        self.settings_button = QToolButton(icon=icon("settings"))
        self.stop_button = QToolButton(icon=icon("stop"))  # this column only; the composer's Stop stops them all
        self.stop_button.setToolTip(self.tr("Stop this column's answer; the others go on"))
        self.stop_button.hide()
        # closes this column, whichever it is (the column count takes the last one)
        self.close_button = QToolButton(icon=icon("close"), autoRaise=True)
        self.close_button.setToolTip(self.tr("Close this column; its answers become a chat in the sidebar"))
        self.close_button.setIconSize(QSize(12, 12))
        self.close_button.setSizePolicy(_kept_when_hidden(self.close_button.sizePolicy()))
        self.promote_button = QToolButton(text=self.tr("Make chat"))
        self.promote_button.setToolTip(self.tr("Move this column to the sidebar as a normal chat"))
        self.view = ChatView(service)
        self.view.delegate.narrow_below = NARROW_TEXT
        # one line, shorter where narrow (status_line.shorter): wrapped, a third column's line was cut to half lines
        # and the answer's view jumped by a line as its figures came
        self.stats = ElidedLabel(objectName="statusText", least_head="MMMM…")
        self.stats.setMinimumHeight(self.stop_button.sizeHint().height())  # Stop coming and going moves nothing above
        # "reading the prompt · 0 s" stood still until the first token, where the chat's line counted the seconds
        self._ticker = SecondsTicker(self._on_models_changed, self)
        head = QHBoxLayout()
        head.addWidget(self.picker, 1)
        head.addWidget(self.settings_button)
        head.addWidget(self.promote_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        top = QHBoxLayout()
        top.addWidget(self.label, 1)
        top.addWidget(self.close_button)
        layout.addLayout(top)
        layout.addLayout(head)
        layout.addWidget(self.view, 1)
        foot = QHBoxLayout()  # Stop beside the speed line: in the head it made a streaming column 30 px wider
        foot.addWidget(self.stats, 1)
        foot.addWidget(self.stop_button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(foot)
        self.picker.currentIndexChanged.connect(self._on_model)
        self.settings_button.clicked.connect(self.edit_settings)
        self.stop_button.clicked.connect(lambda: self.service.stop(self.conv_id))
        self.promote_button.clicked.connect(lambda: self.promote_requested.emit(self))
        self.close_button.clicked.connect(lambda: self.close_requested.emit(self))
        service.status_changed.connect(self._on_status)
        service.settings_changed.connect(self._on_settings)  # set elsewhere (its settings dialog, a model removed)
        # loading progress, then its name; a bound slot, so a removed column stops listening when it is deleted
        models.changed.connect(self._on_models_changed)
        self.attach(conv_id)

    def attach(self, conv_id: int) -> None:
        self.conv_id = conv_id
        self.picker.reload(self.service.store.get(conv_id).settings.model)
        self.view.set_conversation(conv_id)
        self._on_status(conv_id)

    def set_letter(self, letter: str) -> None:
        self.letter = letter
        self.settings_button.setToolTip(self.tr("Settings of column %1").replace("%1", letter))
        self.settings_button.setAccessibleName(self.tr("Settings of column %1").replace("%1", letter))  # icon only
        self.stop_button.setAccessibleName(self.tr("Stop column %1").replace("%1", letter))
        # a screen reader read "Make chat" for every column, not which one moves to the sidebar
        self.promote_button.setAccessibleName(self.tr("Make column %1 a chat").replace("%1", letter))
        self.close_button.setAccessibleName(self.tr("Close column %1").replace("%1", letter))
        self.view.setAccessibleName(self.tr("Column %1 messages").replace("%1", letter))
        self.picker.setAccessibleName(self.tr("Model of column %1").replace("%1", letter))
        self.stats.setAccessibleName(self.tr("Column %1 status").replace("%1", letter))

    def set_label(self, text: str, name_end: int = 0) -> None:
        """`name_end`: where the model's name ends in `text`; a narrow column shortens the name (the picker shows it),
        not the settings after it that tell the columns apart ("A: Gemma 3 270M (embedded, base …" hid "T 0.8")."""
        self.label.setText(text, head=name_end)  # the whole label in its tooltip

    def model_name(self, key: str | None = None) -> str:
        """A model (the column's own by default) by the name it is listed under, as the picker shows it: the
        file's own name ("hf", "qwen3") read differently from the picker's."""
        key = key or self.service.store.get(self.conv_id).settings.model
        entry = self.models.registry.get(key)
        state = self.models.state(key)
        return entry.name if entry is not None else state.name if state is not None and state.name else key

    def answering_key(self) -> str:
        """The model of the answer under way (a model picked since applies from the next), else the column's."""
        live = self.service.live(self.conv_id)
        if live.turn is not None and live.turn.turn_id is not None and live.model_key:
            return live.model_key
        return self.service.store.get(self.conv_id).settings.model

    def set_model(self, key: str) -> None:
        self.picker.reload(key)
        self._on_model()

    def edit_settings(self) -> None:
        conv = self.service.store.get(self.conv_id)
        title = self.tr("Column %1 settings").replace("%1", self.letter)
        dialog = SettingsDialog(self.models.registry, conv.settings, title, self, offer_default=False,
                                presets=self.presets, thinking_switch=thinking_switch_of(self.models),
                                answering=self.service.busy(self.conv_id))
        if dialog.exec():
            self.service.set_settings(self.conv_id, dialog.settings())

    def _on_model(self, *_args) -> None:
        settings = self.service.store.get(self.conv_id).settings
        self.service.set_settings(self.conv_id, settings.copy(model=self.picker.key()))

    def _on_settings(self, conv_id: int) -> None:
        if conv_id == self.conv_id and self.service.store.has(conv_id):
            self.picker.follow(self.service.store.get(conv_id).settings.model)

    def _on_models_changed(self, _key: str = "") -> None:
        self._on_status(self.conv_id)

    def _on_status(self, conv_id: int) -> None:
        if conv_id != self.conv_id or not self.service.store.has(conv_id):
            return
        self.stop_button.setVisible(self.service.busy(conv_id))
        s = self.service.status(conv_id)
        state = self.models.state(self.service.store.get(conv_id).settings.model)
        loading = ""
        if state is not None and state.status == "loading":
            loading = self.tr("loading %1").replace("%1", f"{state.fraction:.0%}")
        elif state is not None and state.status == "failed":
            loading = self.tr("failed to load")
        elif state is None and not self.service.busy(conv_id):  # unloaded: the last answer's figures read as if loaded
            loading = self.tr("not loaded: loads when you send")
        if not s.model and state is not None:  # a copy: the service's status is not ours to change
            s = replace(s, model=state.name or state.entry.name)
        elif s.state == "idle" and state is not None and state.name and s.model != state.name:
            s = ChatStatus(model=state.name)  # another model picked since: the figures were the other one's
        if s.model and (state is None or s.model in (state.name, state.entry.name) or self.service.busy(conv_id)):
            s = replace(s, model=self.model_name(self.answering_key()))  # the name the picker and label show
        self.stats.setText(describe(s, loading), shorter=shorter(s, loading))
        self._ticker.follow(s)


def _kept_when_hidden(policy: QSizePolicy) -> QSizePolicy:
    policy.setRetainSizeWhenHidden(True)  # the label's row keeps its height where a column cannot close
    return policy
