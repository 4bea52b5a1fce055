"""Every message the status bar shows, kept for reading in full: the bar is one line, so a long message (a load's
notices, several at once) was cut at the window's edge, and the next message replaced it, unread, for good."""
from __future__ import annotations

import html
import time
from collections import deque

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QPlainTextEdit, QStatusBar, QVBoxLayout, QWidget

KEPT = 200  # messages a session keeps (a few a minute at most)


class StatusMessages(QObject):
    """Hover the bar: the message up, whole (its tooltip). View ▸ Recent messages…: every one since the start."""

    def __init__(self, bar: QStatusBar):
        super().__init__(bar)
        self.bar = bar
        self.entries: deque[tuple[str, str]] = deque(maxlen=KEPT)  # (HH:MM:SS, message), oldest first
        bar.messageChanged.connect(self._on_message)

    def _on_message(self, text: str) -> None:
        self.bar.setToolTip(f"<p>{html.escape(text)}</p>" if text else "")  # rich text: Qt wraps it
        if text and (not self.entries or self.entries[-1][1] != text):
            self.entries.append((time.strftime("%H:%M:%S"), text))

    def text(self) -> str:
        return "\n".join(f"{at}  {message}" for at, message in self.entries)

    def show_dialog(self, parent: QWidget) -> QDialog:
        """The messages, newest last, in a read-only box whose text can be selected and copied."""
        dialog = QDialog(parent, windowTitle=self.tr("Recent messages"))
        box = QPlainTextEdit(readOnly=True)
        box.setPlainText(self.text() or self.tr("No messages yet."))
        box.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        box.moveCursor(box.textCursor().MoveOperation.End)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(dialog.reject)
        layout = QVBoxLayout(dialog)
        layout.addWidget(box)
        layout.addWidget(close)
        line = box.fontMetrics()
        dialog.resize(80 * line.averageCharWidth(), 20 * line.height())
        dialog.open()
        return dialog
