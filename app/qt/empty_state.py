"""What an empty chat shows: which model answers, what kind of model it is, and prompts to start from."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from app.core.model_registry import ModelEntry
from app.qt.elided_label import ElidedButton

MAX_WIDTH = 560  # a readable line length, centred in wide windows
LINE_CHARS = 80  # the same line under a larger font: the column widens with it


class EmptyState(QWidget):
    prompt_chosen = Signal(str)  # a sample prompt the user picked: it goes into the composer, not sent

    def __init__(self, parent=None):
        super().__init__(parent, objectName="emptyState")
        self.title = QLabel(objectName="emptyTitle", alignment=Qt.AlignmentFlag.AlignHCenter)
        self.note = QLabel(objectName="emptyNote", wordWrap=True, alignment=Qt.AlignmentFlag.AlignHCenter)
        self.note.setTextFormat(Qt.TextFormat.RichText)
        self.samples_label = QLabel(self.tr("Try one of these:"), alignment=Qt.AlignmentFlag.AlignHCenter)
        self.buttons: list[QPushButton] = []
        self.column = QWidget()  # fills the pane up to a readable width, centred
        self.column.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self._fit_column()
        self._box = QVBoxLayout(self.column)
        for w in (self.title, self.note, self.samples_label):
            self._box.addWidget(w)
        self._samples_at = self._box.count()
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.column, 20)
        row.addStretch(1)
        page = QWidget(objectName="emptyPage")
        inner = QVBoxLayout(page)
        inner.addStretch(1)
        inner.addLayout(row)
        inner.addStretch(2)
        # a large font in a short window scrolls: the note's lines were squeezed over one another
        self.scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setWidget(page)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.scroll)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._fit_column()

    def _fit_column(self) -> None:
        self.column.setMaximumWidth(max(MAX_WIDTH, LINE_CHARS * self.column.fontMetrics().averageCharWidth()))

    def show_for(self, entry: ModelEntry | None) -> None:
        base = entry is None or entry.kind == "embedded"
        name = entry.name if entry is not None else self.tr("the embedded model")
        self.title.setText(f"<h2>{self.tr('Start a chat')}</h2>")
        self.note.setText(self._base_note(name) if base else self.tr("This chat uses <b>%1</b>.").replace("%1", name))
        self._set_samples(self._base_samples() if base else self._chat_samples())

    def _base_note(self, name: str) -> str:
        return self.tr(
            "This chat uses <b>%1</b>, the small model built into Parley. It is a <b>base model</b>: it "
            "continues the text you give it rather than following instructions, so begin the way you want the "
            "answer to go. For an assistant that follows instructions, import an instruction-tuned GGUF "
            "(File ▸ Import GGUF file…) and pick it in the model list above.").replace("%1", name)

    def _base_samples(self) -> list[str]:
        return [self.tr("Once upon a time, in a village by the sea, there lived"),
                self.tr("The three things every beginner should know about baking bread are"),
                self.tr("Q: Why is the sky blue?\nA:"),
                "def is_prime(n):\n"]

    def _chat_samples(self) -> list[str]:
        return [self.tr("Explain how a bicycle stays upright."), self.tr("Write a haiku about autumn rain."),
                self.tr("Summarize the plot of Hamlet in three sentences."),
                self.tr("Suggest a dinner recipe that uses chickpeas.")]

    def _set_samples(self, prompts: list[str]) -> None:
        if [b.property("prompt") for b in self.buttons] == prompts:
            return
        for button in self.buttons:
            button.deleteLater()
        self.buttons = []
        for i, prompt in enumerate(prompts):
            button = ElidedButton(prompt.replace("\n", " ⏎ ").strip(), objectName="samplePrompt")
            button.setProperty("prompt", prompt)
            button.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
            button.setMinimumWidth(120)  # a narrow window shortens a long sample rather than growing
            button.setToolTip(prompt)
            button.setAccessibleName(self.tr("Sample prompt: %1").replace("%1", prompt))
            button.clicked.connect(lambda _c=False, p=prompt: self.prompt_chosen.emit(p))
            self._box.insertWidget(self._samples_at + i, button)
            self.buttons.append(button)
