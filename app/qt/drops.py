"""Files dropped on the window: a GGUF file or model folder is imported, a Parley export's chats are imported, and any
other text file goes into the message box under the pointer (or the page's own) as its text; files pasted into a
message box (copied in a file manager) do the same."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QMimeData
from PySide6.QtWidgets import QMainWindow, QPlainTextEdit

from app.core.dropped import dropped_text, kind_of
from engine.errors import ParleyError

DRAG_EVENTS = (QEvent.Type.DragEnter, QEvent.Type.DragMove)


def local_paths(mime: QMimeData) -> list[Path]:
    """The local files a drag carries; none for text, links to web pages, or a mix of files and other things."""
    if not mime.hasUrls():
        return []
    urls = mime.urls()
    return [Path(u.toLocalFile()) for u in urls] if all(u.isLocalFile() for u in urls) else []


class FileDrops(QObject):
    def __init__(self, window: QMainWindow, editors: list[QPlainTextEdit], import_chats):
        """`editors`: the message boxes a dropped document may go into; `import_chats(path)` imports an export."""
        super().__init__(window)
        self.window, self.editors, self.import_chats = window, editors, import_chats
        window.setAcceptDrops(True)
        window.installEventFilter(self)
        for edit in editors:  # a message box takes text drops and pastes itself: files dropped or pasted are ours
            edit.viewport().installEventFilter(self)
            edit.on_files = partial(self.open, editor=edit)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() not in (*DRAG_EVENTS, QEvent.Type.Drop):
            return False
        paths = local_paths(event.mimeData())
        if not paths:
            return False  # text dragged into a message box: the box's own drop
        event.acceptProposedAction()
        if event.type() == QEvent.Type.Drop:
            target = next((e for e in self.editors if e.viewport() is watched), None)
            self.open(paths, target)
        return True

    def open(self, paths: list[Path], editor: QPlainTextEdit | None = None) -> None:
        """Each path as its kind asks; a document's text into `editor`, or the current page's message box."""
        for path in paths:
            kind = kind_of(path)
            if kind == "model":
                self.window.import_model(str(path))
            elif kind == "chats":
                self.import_chats(path)
            else:
                self._insert(path, editor or self._current_editor())

    def _insert(self, path: Path, editor: QPlainTextEdit | None) -> None:
        try:
            text = dropped_text(path)
        except ParleyError as exc:
            self.window._warn(self.tr("Cannot add the file"), str(exc))
            return
        if editor is None or editor.isReadOnly():
            return
        editor.setFocus()
        editor.insertPlainText(text)

    def _current_editor(self) -> QPlainTextEdit | None:
        return next((e for e in self.editors if e.isVisible()), None)
