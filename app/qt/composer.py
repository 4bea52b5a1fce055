"""The composer: Enter sends, Shift+Enter starts a new line; Send turns into Stop while the chat answers."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.qt.drops import local_paths
from app.qt.theme import icon


def lines_high(edit: QPlainTextEdit, lines: int, least: int) -> int:
    """A fixed height that shows `lines` lines of the edit's font (and never less than `least` px)."""
    margins = 2 * (edit.document().documentMargin() + edit.frameWidth()) + 12  # + the style sheet's 6 px padding
    return max(least, int(lines * edit.fontMetrics().lineSpacing() + margins))


class LinkNote(QLabel):
    """A note above the box whose link the keyboard reaches too: Tab lands on the link itself, Enter follows it."""

    def __init__(self, **kwargs):
        super().__init__(wordWrap=True, **kwargs)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.LinksAccessibleByMouse
                                     | Qt.TextInteractionFlag.LinksAccessibleByKeyboard)

    def focusInEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().focusInEvent(event)
        reason = event.reason()
        if reason in (Qt.FocusReason.TabFocusReason, Qt.FocusReason.BacktabFocusReason):
            # onto the link (a note without one passes the focus on)
            self.focusNextPrevChild(reason == Qt.FocusReason.TabFocusReason)


class PromptEdit(QPlainTextEdit):
    submitted = Signal()
    escaped = Signal()
    on_files = None  # set by the window's file drops: files copied in a file manager and pasted give their text

    def insertFromMimeData(self, source) -> None:  # noqa: N802 - Qt's name
        paths = local_paths(source)
        if paths and self.on_files is not None:
            self.on_files(paths)  # their text, not their file:// links
            return
        super().insertFromMimeData(source)

    def event(self, event) -> bool:
        # Ctrl+Shift+Z is the box's Redo on Linux and the window's Undo delete: the box takes it only to redo something
        if (event.type() == QEvent.Type.ShortcutOverride and event.matches(QKeySequence.StandardKey.Redo)
                and not self.document().isRedoAvailable()):
            event.ignore()
            return True
        return super().event(event)

    def keyPressEvent(self, event) -> None:
        key, mods = event.key(), event.modifiers()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not mods & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        if key == Qt.Key.Key_Escape:
            self.escaped.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    edit_cancelled = Signal()

    def __init__(self, placeholder: str | None = None, parent=None):
        super().__init__(parent)
        self.banner = QLabel(objectName="editBanner", wordWrap=True)  # its one long line widened a narrow window
        self.banner.hide()
        self.edit = PromptEdit(objectName="prompt")
        self.edit.setPlaceholderText(placeholder or self.tr("Message — Enter sends, Shift+Enter for a new line"))
        self.edit.setAccessibleName(self.tr("Message"))
        self.edit.setTabChangesFocus(True)  # Tab moves on to Send (keyboard users are not trapped); Shift+Enter breaks lines
        self.edit.setFixedHeight(lines_high(self.edit, 3, 72))  # three lines at any font size
        self.send_button = QPushButton(icon("send", "#ffffff"), self.tr("Send"), objectName="sendButton")
        self.send_button.setToolTip(self.tr("Send (Enter); while the chat answers, the message waits its turn"))
        self.stop_button = QPushButton(icon("stop", "#ffffff"), self.tr("Stop"), objectName="stopButton")
        self.stop_button.setToolTip(self.tr("Stop the answer (Esc)"))
        self.stop_button.hide()
        row = QHBoxLayout()
        row.addWidget(self.edit, 1)
        row.addWidget(self.send_button)
        row.addWidget(self.stop_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.banner)
        layout.addLayout(row)
        self.edit.submitted.connect(self._send)
        self.edit.escaped.connect(self._escape)
        self.send_button.clicked.connect(self._send)
        self.stop_button.clicked.connect(self.stop_requested)

    def set_busy(self, busy: bool) -> None:
        hiding = self.send_button if busy else self.stop_button
        had_focus = hiding.isVisible() and self.window().focusWidget() is hiding
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)
        if had_focus:  # Qt would pass focus on to the next widget (New chat, where a second Space makes a chat)
            self.edit.setFocus()

    def begin_edit(self, text: str) -> None:
        self.banner.setText(self.tr("Editing an earlier message: sending makes a new branch (the old one stays). Esc cancels."))
        self.banner.show()
        self.edit.setPlainText(text)
        self.edit.setFocus()

    def end_edit(self) -> None:
        self.banner.hide()

    def _send(self) -> None:
        text = self.edit.toPlainText()
        if text.strip():
            self.send_requested.emit(text)

    def cancel_edit(self) -> None:
        self.banner.hide()
        self.edit.clear()
        self.edit_cancelled.emit()

    def _escape(self) -> None:
        if self.banner.isVisible():
            self.cancel_edit()
        else:
            self.stop_requested.emit()
