"""Two compare columns' last answers side by side in one text, word by word."""
from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QDialog, QDialogButtonBox, QHBoxLayout, QLabel, QTextEdit, QVBoxLayout

from app.core.comparison import word_diff

if TYPE_CHECKING:
    from app.qt.compare import CompareView

PICKER_CHARS = 24  # each column picker's width in characters: the dialog fits any screen


class DiffDialog(QDialog):
    """Two columns' last answers, word by word: what only the first says struck out, what only the second adds."""

    def __init__(self, view: "CompareView"):
        super().__init__(view)
        self.view = view
        self.setWindowTitle(self.tr("Compare two answers"))
        self.resize(720, 480)
        self.left, self.right = _picker(), _picker()
        for i, column in enumerate(view.columns):
            for box in (self.left, self.right):
                box.addItem(column.label.full_text() or column.letter, i)
                box.setItemData(i, column.label.full_text(), Qt.ItemDataRole.ToolTipRole)
        self.right.setCurrentIndex(min(1, self.right.count() - 1))
        self.summary = QLabel()
        self.text = QTextEdit(readOnly=True)
        self.text.setAccessibleName(self.tr("Differences"))
        pick = QHBoxLayout()
        pick.addWidget(self.left, 1)
        pick.addWidget(QLabel("→"))
        pick.addWidget(self.right, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(pick)
        layout.addWidget(self.summary)
        layout.addWidget(self.text, 1)
        layout.addWidget(buttons)
        self.left.currentIndexChanged.connect(self.refresh)
        self.right.currentIndexChanged.connect(self.refresh)
        view.service.turn_done.connect(self._on_turn_done)  # bound: the connection goes with the dialog
        self.refresh()

    def _on_turn_done(self, conv_id: int, _msg_id: int) -> None:
        """Opened while the columns answered, it showed what they had so far until a picker was changed."""
        if any(c.conv_id == conv_id for c in self.view.columns):
            self.refresh()

    def refresh(self) -> None:
        if not self.view.columns:
            return
        a = self.view.last_answer(self.view.columns[self.left.currentData()])
        b = self.view.last_answer(self.view.columns[self.right.currentData()])
        diff, agree = word_diff(a, b)
        self.summary.setText(self.tr("%1% of the words agree").replace("%1", f"{agree * 100:.0f}") if a or b
                             else self.tr("Neither column has answered yet."))  # two nothings "agreed" 100 %
        self.text.setHtml(diff)  # escaped text only: nothing for the editor to load


def _picker() -> QComboBox:
    """A column picker that elides a long label (a 200-character model name) instead of widening the dialog."""
    box = QComboBox()
    box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    box.setMinimumContentsLength(PICKER_CHARS)
    return box
