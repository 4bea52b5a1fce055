"""A one-line label that ends in "…" when it is narrower than its text, and never asks for the text's width."""
from __future__ import annotations

from typing import Sequence

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QPushButton, QSizePolicy, QToolButton


class ElidedLabel(QLabel):
    """Titles and labels of any length: a long one must not widen the window (the full text is its tooltip)."""

    def __init__(self, text: str = "", parent=None, least_head: str = "M…M", **kwargs):
        super().__init__(parent, **kwargs)
        self._full, self._head, self._shorter = "", 0, ()
        self._least_head = least_head  # a head shortened below this width gives way to the next shorter text
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str, head: int = 0,  # noqa: N802 - Qt's name
                shorter: Sequence[tuple[str, int]] = ()) -> None:
        """`head`: how many of the text's first characters give way first (a name before the figures after it).
        `shorter`: (text, head) pairs, each shorter than the last, shown in turn where the one before does not fit; the
        last one ends in "…". The tooltip and full_text() keep `text`."""
        self._full, self._head, self._shorter = text, head, tuple(shorter)
        self.setToolTip(text if text else "")
        self._elide()
        self.updateGeometry()  # the size hint is the full text's: a layout must hear of it even when "…" stays "…"

    def full_text(self) -> str:
        return self._full

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(0, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(self.fontMetrics().horizontalAdvance(self._full), super().sizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        metrics, width = self.fontMetrics(), max(0, self.width())
        candidates = ((self._full, self._head), *self._shorter)
        for text, head in candidates:
            if metrics.horizontalAdvance(text) <= width:
                super().setText(text)
                return
            tail = text[head:]
            room = width - metrics.horizontalAdvance(tail)
            if head and room >= metrics.horizontalAdvance(self._least_head):
                super().setText(metrics.elidedText(text[:head], Qt.TextElideMode.ElideMiddle, room) + tail)
                return
        super().setText(metrics.elidedText(candidates[-1][0], Qt.TextElideMode.ElideRight, width))


class ElidedButton(QPushButton):
    """A push button whose long text ends in "…" when the button is narrower (Qt cut it at both edges, mid-word)."""

    def __init__(self, text: str = "", parent=None, **kwargs):
        super().__init__(parent, **kwargs)
        self._full = text
        super().setText(text)

    def full_text(self) -> str:
        return self._full

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        """The whole text's hint, whatever is shown now: the shown text's, widened by what the "…" cut off."""
        hint, metrics = super().sizeHint(), self.fontMetrics()
        cut = metrics.horizontalAdvance(self._full) - metrics.horizontalAdvance(self.text())
        return QSize(hint.width() + max(0, cut), hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        room = self.contentsRect().width() - 2 * self.fontMetrics().horizontalAdvance("M")  # the frame's padding
        super().setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, max(0, room)))


class IconWhenNarrow(QToolButton):
    """A tool button showing its icon and text where there is room for both, its icon alone where there is not: it
    asks a layout for no more than the icon's width (its text and accessible name stay)."""

    def __init__(self, parent=None, **kwargs):
        super().__init__(parent, **kwargs)
        self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, self.sizePolicy().verticalPolicy())  # a tool button's is Fixed
        self._sizes: tuple[QSize, QSize] | None = None  # (icon alone, icon and text), measured once per font and style

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return self._measured()[1]

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return self._measured()[0]

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        whole = self.width() >= self._measured()[1].width()
        wanted = Qt.ToolButtonStyle.ToolButtonTextBesideIcon if whole else Qt.ToolButtonStyle.ToolButtonIconOnly
        if self.toolButtonStyle() != wanted:
            self.setToolButtonStyle(wanted)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._sizes = None
        super().changeEvent(event)

    def _measured(self) -> tuple[QSize, QSize]:
        if self._sizes is None:
            shown = self.toolButtonStyle()
            sizes = []
            for style in (Qt.ToolButtonStyle.ToolButtonIconOnly, Qt.ToolButtonStyle.ToolButtonTextBesideIcon):
                self.setToolButtonStyle(style)  # QToolButton's own hint for each
                sizes.append(super().sizeHint())
            self.setToolButtonStyle(shown)
            self._sizes = (sizes[0], sizes[1])
        return self._sizes
