"""Chat settings: model, system prompt, sampling, max tokens, overflow policy; optionally the defaults for new chats."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import Qt, Signal, SignalInstance
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QHBoxLayout, QInputDialog, QLabel,
    QFrame, QPlainTextEdit, QPushButton, QScrollArea, QSpinBox, QStyle, QStyleOptionComboBox, QStylePainter, QVBoxLayout, QWidget,
)

from app.core.chat_settings import DRAW_ONLY, OVERFLOW_CHOICES, THINKING_CHOICES, ChatSettings
from app.core.model_registry import ModelRegistry
from app.core.presets import Presets
from app.qt.composer import lines_high
from app.qt.theme import icon
from engine.sampling import GREEDY_BELOW, MAX_INT32


MIN_CHARS = 24  # the picker's width in characters: most model names whole, a long one elided


class ModelPicker(QComboBox):
    """The registry's models; `import_requested` asks the window to import one from disk."""

    def __init__(self, registry: ModelRegistry, parent=None):
        super().__init__(parent)
        self.registry = registry
        # a long model name (a GGUF file stem) elides instead of widening the window or the settings dialog
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(MIN_CHARS)
        self.reload()

    def reload(self, key: str | None = None) -> None:
        key = key if key is not None else self.currentData()
        self.blockSignals(True)
        self.clear()
        for entry in self.registry.entries():
            self.addItem(entry.name, entry.key)
            self.setItemData(self.count() - 1, f"{entry.name}\n{entry.path}", Qt.ItemDataRole.ToolTipRole)
        if key is not None and self.findData(key) >= 0:
            self.setCurrentIndex(self.findData(key))
        self.blockSignals(False)

    def key(self) -> str:
        return self.currentData()

    def follow(self, key: str) -> None:
        """Names `key`, chosen elsewhere (no currentIndexChanged: it is set already)."""
        if self.key() != key:
            self.reload(key)

    def shown_text(self) -> str:
        """The current name as the closed picker shows it: elided in the middle, so a quantisation suffix stays."""
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        field = self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, opt,
                                            QStyle.SubControl.SC_ComboBoxEditField, self)
        return self.fontMetrics().elidedText(opt.currentText, Qt.TextElideMode.ElideMiddle, field.width())

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt's name
        painter = QStylePainter(self)
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, opt)
        opt.currentText = self.shown_text()
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, opt)


class SettingsForm(QWidget):
    import_requested = Signal()

    def __init__(self, registry: ModelRegistry, settings: ChatSettings, parent=None, presets: Presets | None = None,
                 thinking_switch: Callable[[str], bool | None] = lambda key: None):
        super().__init__(parent)
        self.presets = presets
        self.thinking_switch = thinking_switch  # a model key -> whether its template reads Thinking (None: unknown)
        known = getattr(thinking_switch, "known", None)
        if known is not None:  # a model file's template read off the GUI thread: grey Thinking once it is known
            known.connect(self._on_thinking_known)
        self.model = ModelPicker(registry)
        self.import_button = QPushButton(icon("import"), "Import…")
        self.system = QPlainTextEdit()
        self.system.setPlaceholderText("Optional instructions for the model")
        self.system.setFixedHeight(lines_high(self.system, 3, 70))
        self.temperature = _double(0, 5, 0.05, 3)
        self.top_p = _double(0.001, 1, 0.01, 3)
        self.top_k = _int(0, MAX_INT32)
        self.min_p = _double(0, 0.999, 0.01, 3)
        self.repetition = _double(0.5, 5, 0.01, 2)
        self.repeat_last_n = _int(-1, 2**31 - 1)
        self.repeat_last_n.setSpecialValueText(self.tr("the whole chat"))
        self.repeat_last_n.setToolTip(self.tr("How many of the latest tokens the repetition penalty looks at "
                                              "(0 = none)"))
        self.seed = _int(-1, MAX_INT32)
        self.seed.setSpecialValueText("random")
        self.seed.setToolTip(self.tr("A message's first answer draws with this seed, each Regenerate with the next "
                                     "one (seed + 1, + 2, …): another answer, and the same ones in any chat with this "
                                     "seed. An answer's menu draws it again: Regenerate with seed N."))
        self.max_tokens = _int(1, MAX_INT32)
        self.speculative = QCheckBox(self.tr("Draft ahead (the same answer; faster when it repeats the prompt)"))
        self.thinking = QComboBox()
        for value, label in THINKING_CHOICES:
            self.thinking.addItem(self.tr(label), value)
        self.thinking.setToolTip(self.tr("For models that think before they answer (Qwen3, SmolLM3); others ignore it"))
        self.overflow = QComboBox()
        for choice, label in zip(OVERFLOW_CHOICES, ("Stop when the context is full", "Drop the oldest turns")):
            self.overflow.addItem(label, choice)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model, 1)
        model_row.addWidget(self.import_button)
        # a line under the field that makes others do nothing: they are greyed, and this says why
        self.greedy_note = _note(self.tr("0 always takes the likeliest token: top-p, top-k, min-p and the seed "
                                         "change nothing"))
        self.penalty_note = _note(self.tr("1 penalizes nothing: the penalty window changes nothing"))
        self.thinking_note = _note("")
        form = self._form = QFormLayout(self)
        if presets is not None:
            form.addRow(self.tr("Preset"), self._preset_row())
        form.addRow("Model", model_row)
        form.addRow("System prompt", self.system)
        for label, w in [("Temperature", self.temperature), ("", self.greedy_note), ("Top-p", self.top_p),
                         ("Top-k (0 = off)", self.top_k), ("Min-p", self.min_p),
                         ("Repetition penalty", self.repetition), ("", self.penalty_note),
                         (self.tr("Penalty window (tokens)"), self.repeat_last_n), ("Seed", self.seed),
                         ("Max tokens", self.max_tokens), ("Context overflow", self.overflow),
                         (self.tr("Speculative decoding"), self.speculative), (self.tr("Thinking"), self.thinking),
                         ("", self.thinking_note)]:
            form.addRow(label, w)
        self.import_button.clicked.connect(self.import_requested)
        self.temperature.valueChanged.connect(self._grey_unused)
        self.repetition.valueChanged.connect(self._grey_unused)
        self.model.currentIndexChanged.connect(self._grey_unused)
        self._loaded, self._shown = settings, {}
        self.set_settings(settings)

    def _grey_unused(self, _value: float = 0) -> None:
        """Fields the temperature or the penalty make do nothing are greyed with a line why (their values are kept:
        the form accepted a seed beside temperature 0 and the answer ignored it without a word)."""
        greedy = self._number_values()["temperature"] < GREEDY_BELOW
        numbers = self._numbers()
        for name in DRAW_ONLY:
            numbers[name].setEnabled(not greedy)
        self._form.setRowVisible(self.greedy_note, greedy)
        neutral = self._number_values()["repetition_penalty"] == 1
        self.repeat_last_n.setEnabled(not neutral)
        self._form.setRowVisible(self.penalty_note, neutral)
        unswitched = self.thinking_switch(self.model.key()) is False
        self.thinking.setEnabled(not unswitched)
        self.thinking_note.setText(self.tr("%1's chat template has no thinking switch: it answers the same either "
                                           "way").replace("%1", self.model.currentText()))
        self._form.setRowVisible(self.thinking_note, unswitched)

    def _on_thinking_known(self, key: str) -> None:
        if key == self.model.key():
            self._grey_unused()

    def _numbers(self) -> dict[str, QSpinBox | QDoubleSpinBox]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "repetition_penalty": self.repetition, "repeat_last_n": self.repeat_last_n, "seed": self.seed,
                "max_tokens": self.max_tokens}

    def _preset_row(self) -> QHBoxLayout:
        """Pick a preset (fills the form, the model stays), save the form as one, or delete the one picked."""
        self.preset = QComboBox()
        self.preset.setAccessibleName(self.tr("Preset"))
        self.save_preset = QPushButton(self.tr("Save as preset…"))
        self.delete_preset = QPushButton(self.tr("Delete preset"))
        self._reload_presets()
        self.preset.activated.connect(self._apply_preset)
        self.save_preset.clicked.connect(self._ask_preset_name)
        self.delete_preset.clicked.connect(self._delete_preset)
        row = QHBoxLayout()
        row.addWidget(self.preset, 1)
        row.addWidget(self.save_preset)
        row.addWidget(self.delete_preset)
        return row

    def _reload_presets(self, current: str | None = None) -> None:
        self.preset.clear()
        self.preset.addItem(self.tr("— none —"), None)
        for name in self.presets.names():
            self.preset.addItem(name, name)
        self.preset.setCurrentIndex(max(0, self.preset.findData(current)) if current else 0)
        self.delete_preset.setEnabled(current is not None)

    def _apply_preset(self, _index: int = 0) -> None:
        name = self.preset.currentData()
        self.delete_preset.setEnabled(name is not None)
        if name is not None:
            self.set_settings(self.presets.get(name, self.model.key()))

    def save_as_preset(self, name: str) -> str:
        saved = self.presets.save(name, self.settings())
        self._reload_presets(saved)
        return saved

    def _ask_preset_name(self) -> None:
        name, ok = QInputDialog.getText(self, self.tr("Save as preset"), self.tr("Preset name:"),
                                        text=self.preset.currentData() or "")
        if ok and name.strip():
            self.save_as_preset(name)

    def _delete_preset(self) -> None:
        name = self.preset.currentData()
        if name is not None:
            self.presets.delete(name)
            self._reload_presets()

    def set_settings(self, s: ChatSettings) -> None:
        self.model.reload(s.model)
        self.system.setPlainText(s.system_prompt)
        for name, w in self._numbers().items():
            value = getattr(s, name)
            value = -1 if value is None else value  # the seed's "random"
            w.setValue(min(max(value, w.minimum()), w.maximum()))  # clamped: a seed past 2**31 overflowed Qt's int
        # what the form showed for each loaded value: a field left as shown keeps the value loaded (the form rounds
        # 0.005 at its decimals and clamps an imported seed past 2**31; saving must not change what was not touched)
        self._loaded, self._shown = s, {name: w.value() for name, w in self._numbers().items()}
        self.overflow.setCurrentIndex(max(0, self.overflow.findData(s.overflow)))
        self.speculative.setChecked(s.speculative)
        self.thinking.setCurrentIndex([value for value, _ in THINKING_CHOICES].index(s.thinking))
        self._grey_unused()

    def settings(self) -> ChatSettings:
        return ChatSettings(
            model=self.model.key(), system_prompt=self.system.toPlainText().strip(), **self._number_values(),
            overflow=self.overflow.currentData(), speculative=self.speculative.isChecked(),
            thinking=self.thinking.currentData(),
        )

    def _number_values(self) -> dict[str, int | float | None]:
        out = {}
        for name, w in self._numbers().items():
            out[name] = getattr(self._loaded, name) if w.value() == self._shown.get(name) else w.value()
        if out["seed"] is not None and out["seed"] < 0:
            out["seed"] = None
        return out


class SettingsDialog(QDialog):
    def __init__(self, registry: ModelRegistry, settings: ChatSettings, title: str = "Chat settings", parent=None,
                 offer_default: bool = True, presets: Presets | None = None,
                 thinking_switch: Callable[[str], bool | None] = lambda key: None, answering: bool = False):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.form = SettingsForm(registry, settings, presets=presets, thinking_switch=thinking_switch)
        # an answer under way keeps the settings it was sent with: OK mid-answer changed nothing visible, unsaid
        self.answering_note = QLabel(self.tr("An answer is under way: it keeps the settings it started with; these "
                                             "apply from the next one."), wordWrap=True)
        self.answering_note.setVisible(answering)
        self.as_default = QCheckBox("Also use these settings for new chats")
        self.as_default.setVisible(offer_default)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        scroll.setWidget(self.form)
        layout = QVBoxLayout(self)
        layout.addWidget(self.answering_note)
        layout.addWidget(scroll, 1)
        layout.addWidget(self.as_default)
        layout.addWidget(buttons)
        note = self.answering_note.sizeHint().height() if answering else 0
        self._fit_screen(scroll, self.as_default.sizeHint().height() + buttons.sizeHint().height() + note)

    def _fit_screen(self, scroll: QScrollArea, below: int) -> None:
        """The form at its whole size where the screen holds it, else as much as fits and it scrolls: under a large
        font it was taller than a laptop's screen, OK and Cancel off its bottom."""
        screen = (self.parentWidget() or self).screen() or QGuiApplication.primaryScreen()
        room = screen.availableGeometry()
        hint = self.form.sizeHint()
        chrome = 3 * self.layout().spacing() + 2 * self.style().pixelMetric(QStyle.PixelMetric.PM_LayoutTopMargin) + 48
        height = min(hint.height(), room.height() - below - chrome)
        bar = scroll.verticalScrollBar().sizeHint().width() if height < hint.height() else 0
        scroll.setMinimumSize(min(hint.width() + bar, room.width() - 48), height)

    def settings(self) -> ChatSettings:
        return self.form.settings()


def _double(lo: float, hi: float, step: float, decimals: int) -> QDoubleSpinBox:
    w = QDoubleSpinBox()
    w.setRange(lo, hi)
    w.setSingleStep(step)
    w.setDecimals(decimals)
    return w


@dataclass(frozen=True, slots=True)
class ThinkingSwitch:
    """A model key -> whether its chat template reads the Thinking setting (None: unknown, or its file still being
    read); `known` is emitted with a key once its file has been read."""

    ask: Callable[[str], bool | None]
    known: SignalInstance | None = None

    def __call__(self, key: str) -> bool | None:
        return self.ask(key)


def thinking_switch_of(models) -> ThinkingSwitch:
    """Whether a model's chat template reads the Thinking setting, from its load or, before, its file's header (None
    where neither says, or until the file is read off the GUI thread). `models`: the app's ModelManager."""
    return ThinkingSwitch(models.thinking_switch, models.thinking_known)


def _note(text: str) -> QLabel:
    return QLabel(text, wordWrap=True, enabled=False)  # the disabled palette: a quiet line, not an error


def _int(lo: int, hi: int) -> QSpinBox:
    w = QSpinBox()
    w.setRange(lo, hi)
    return w
