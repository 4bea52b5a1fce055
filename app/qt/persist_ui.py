"""The GUI side of persistence: a flush timer, the store's warning in the status bar, export/import menu actions.

An export reads its chats on a worker, from the chat database as it was when asked (a snapshot), and makes and writes
its text there a chat at a time; an import reads and checks its file on the worker and adds its chats here a slice at a
time. Both finish before the window closes."""
from __future__ import annotations

import sqlite3
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QFileDialog, QLabel, QMainWindow, QMenu

from app.core import export
from app.core.atomic_file import write_text_whole
from app.core.chats import ChatService
from app.core.sqlite_store import snapshot_store
from app.qt.background import Background

FLUSH_MS = 1000  # streamed text reaches the disk at least this often, even when tokens stall
FILTERS = "Markdown (*.md);;JSON — full history with branches (*.json)"
SLICE_S = 0.015  # an import adds chats for this long per turn of the event loop (a chat of long answers: ~2 ms)
WAIT_MS = 1000  # while the chat database takes no changes, an import looks again this often
NEXT_SLICE_MS = 1  # not 0: a zero timer ran before the window's own timers, two slices back to back (30-37 ms)
SHOW_S = 0.5  # an import shows the chats added so far this often, in a turn of its own (3,000-5,000 chats: 3-4 ms)


class PersistenceUI(QObject):
    def __init__(self, window: QMainWindow, service: ChatService, parent: QObject | None = None):
        super().__init__(parent or window)
        self.window, self.service, self.store = window, service, service.store
        self.timer = QTimer(self, interval=FLUSH_MS)
        self.timer.timeout.connect(self.flush)
        self.timer.start()
        self.warning = QLabel(objectName="storeWarning")
        self.warning.setStyleSheet("color: #d33")
        self.warning.hide()
        window.statusBar().addPermanentWidget(self.warning)
        if hasattr(self.store, "on_warning"):
            self.store.on_warning = self.show_warning
            if self.store.warning:
                self.show_warning(self.store.warning)
        if getattr(self.store, "notice", ""):  # changes held back at the last quit, merged in now
            window.statusBar().showMessage(self.store.notice, 15000)
        self.background = Background(self)
        self._importing: deque[_Import] = deque()  # first in first out
        window.installEventFilter(self)
        self._menu()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if watched is self.window and event.type() == QEvent.Type.Close:
            self.finish()  # before the store closes: an export in flight is written, an import added whole
        return False

    def busy(self) -> bool:
        return self.background.pending > 0 or bool(self._importing)

    def finish(self) -> None:
        """Every export written and every import added now, waiting as long as it takes (at quit)."""
        self.background.finish()
        while self._importing:
            self._add_slice(deadline=float("inf"))

    def flush(self) -> None:
        if hasattr(self.store, "flush"):
            self.store.flush()

    def show_warning(self, text: str) -> None:
        if not text:  # the store writes again (another program let go of its lock)
            if self.warning.isVisible():
                self.warning.hide()
                self.window.statusBar().showMessage("Chats are saved again.", 5000)
            return
        # a damaged database set aside and a new one started still saves: only a store in memory does not
        saving = getattr(self.store, "persistent", False) and not getattr(self.store, "locked_out", False)
        self.warning.setText("⚠ Chat database replaced" if saving else "⚠ Not saving chats")
        self.warning.setToolTip(text)
        self.warning.show()
        self.window.statusBar().showMessage(text, 15000)

    def _menu(self) -> None:
        file_menu = next((a.menu() for a in self.window.menuBar().actions() if a.text() == "&File"), None)
        menu = QMenu("Export / import chats", self.window)
        menu.addAction("Export this chat…", self.export_current)
        menu.addAction("Export all chats…", self.export_all)
        menu.addAction("Import chats…", self.import_dialog)
        if file_menu is None:
            self.window.menuBar().addMenu(menu)
            return
        quit_action = file_menu.actions()[-1]
        file_menu.insertMenu(quit_action, menu)
        file_menu.insertSeparator(quit_action)
        self.menu = menu

    # -- actions (the *_to / import_from forms are what tests call)
    def export_current(self) -> None:
        conv_id = getattr(self.window, "current", lambda: None)()
        if conv_id is not None:
            self._export_dialog([conv_id], self.store.get(conv_id).title)

    def export_all(self) -> None:
        self._export_dialog(None, "Parley chats")

    def _export_dialog(self, ids: list[int] | None, name: str) -> None:
        safe = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in name)[:60] or "chat"
        path, chosen = QFileDialog.getSaveFileName(self.window, "Export chats", f"{safe}.md", FILTERS)
        if path:
            self.export_to(path, ids, "json" if "json" in chosen.lower() or path.endswith(".json") else "md")

    def export_to(self, path: str | Path, ids: list[int] | None, fmt: str) -> None:
        """Writes the chats as they are now; the status bar says when the file is written (or a box why not)."""
        snapshot = getattr(self.store, "snapshot", lambda: None)()  # flushes first
        if snapshot is not None:  # the chats read on the worker, from the file as it is now
            read = partial(_read_snapshot, snapshot, ids)
            count = len(ids) if ids is not None else len(self.store.conversations())
        else:  # the file does not hold all that is shown: read here, from memory (~35 us a chat)
            chats = export.chats_of(self.store, ids)
            read, count = (lambda: chats), len(chats)
        pieces = export.json_pieces if fmt == "json" else export.markdown_pieces
        self.window.statusBar().showMessage(f"Exporting {_chats(count)} to {path}…")
        self.background.run(partial(_write_export, Path(path), pieces, read), partial(self._exported, path, count))

    def _exported(self, path: str | Path, count: int, _result: None, error: Exception | None) -> None:
        if error is not None:
            self.window.statusBar().clearMessage()  # 'Exporting…' stayed up under the box, as if still at work
            self._warn("Export failed", f"{path}\n\n{getattr(error, 'strerror', None) or error}")
            return
        self.window.statusBar().showMessage(f"Exported {_chats(count)} to {path}", 5000)

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Import chats", "", "Parley exports (*.json *.md)")
        if path:
            self.import_from(path)

    def import_from(self, path: str | Path, then: Callable[[list[int]], None] | None = None) -> None:
        """Reads and checks the file off the GUI thread, then adds those of its chats not here already; `then(ids)` once
        all are in: the chats added ([] for a file refused)."""
        self.window.statusBar().showMessage(f"Reading {path}…")
        self.background.run(partial(export.read_chats, path), partial(self._read, str(path), then))

    def _read(self, path: str, then, chats: list[dict] | None, error: Exception | None) -> None:
        if error is not None:
            self.window.statusBar().clearMessage()
            self._warn("Import failed", f"{path}\n\n{error}")
            if then is not None:
                then([])
            return
        self._importing.append(_Import(path, deque(chats), len(chats), then))
        if len(self._importing) == 1:
            QTimer.singleShot(0, self._add_slice)

    def _add_slice(self, deadline: float | None = None) -> None:
        """Adds chats of the first import for SLICE_S (a store batch each), then lets the event loop run."""
        if not self._importing:
            return
        job = self._importing[0]
        if job.present is None:  # the store's chats as this import begins (an import before it is in)
            job.present = export.Present(self.store)
        if deadline is None and getattr(self.store, "holding", False):
            self._wait(job)
            return
        deadline = time.monotonic() + SLICE_S if deadline is None else deadline
        with getattr(self.store, "batch", nullcontext)():
            while job.todo and time.monotonic() < deadline:
                job.ids += export.add_chats(self.store, [job.todo.popleft()], job.present)
        if job.todo:
            done = job.total - len(job.todo)
            self.window.statusBar().showMessage(f"Importing {done:,} of {job.total:,} chats…")
            QTimer.singleShot(NEXT_SLICE_MS, self._show_then_add if self._show_due(job) else self._add_slice)
            return
        self._importing.popleft()
        self.service.conversations_changed.emit()
        self.window.statusBar().showMessage(job.said(), 5000)
        if job.then is not None:
            job.then(job.ids)
        if self._importing:
            QTimer.singleShot(0, self._add_slice)

    @staticmethod
    def _show_due(job: _Import) -> bool:
        """The chats added so far appear in the window as they land, not all at the end (3,000 chats: 2-5 s unseen)."""
        if not job.ids or time.monotonic() - job.shown_at < SHOW_S:
            return False
        job.shown_at = time.monotonic()
        return True

    def _show_then_add(self) -> None:
        """A turn of its own between two slices: run with a slice, in one pass of the event loop, the two were one gap."""
        self.service.conversations_changed.emit()
        QTimer.singleShot(NEXT_SLICE_MS, self._add_slice)

    def _wait(self, job: _Import) -> None:
        """The file takes no changes now: the rest waits, added once it does (or at quit, kept with the rest held).
        Added meanwhile, each slice rewrote the file of held changes whole: 2,000 chats froze the window up to 461 ms."""
        done = job.total - len(job.todo)
        self.window.statusBar().showMessage(f"Importing {done:,} of {job.total:,} chats: waiting until chats can be "
                                            "saved again…")
        QTimer.singleShot(WAIT_MS, self._add_slice)

    def _warn(self, title: str, text: str) -> None:
        warn = getattr(self.window, "_warn", None)
        if warn is not None:
            warn(title, text)
        else:
            self.window.statusBar().showMessage(f"{title}: {text}", 15000)


@dataclass(slots=True)
class _Import:
    """One file's import: its checked chats still to add, the ids of those added."""
    path: str
    todo: deque
    total: int
    then: Callable[[list[int]], None] | None
    ids: list[int] = field(default_factory=list)
    present: export.Present | None = None  # the store's chats when its first chat is added
    shown_at: float = float("-inf")  # when the chats added so far were last shown (time.monotonic)

    def said(self) -> str:
        """'Imported N chats from …', with how many were here already (a file imported again, after a crash say)."""
        skipped = self.total - len(self.ids)
        if not skipped:
            return f"Imported {_chats(len(self.ids))} from {self.path}"
        if not self.ids:  # 'Imported 0 chats' read as a failure
            what = "its chat is" if skipped == 1 else f"all {skipped:,} of its chats are"
            return f"Nothing new in {self.path}: {what} here already"
        here = "was" if skipped == 1 else "were"
        return f"Imported {_chats(len(self.ids))} from {self.path}; {skipped:,} of its chats {here} here already"


def _write_export(path: Path, pieces: Callable[[list[dict]], Iterator[str]], read: Callable[[], list[dict]]) -> None:
    write_text_whole(path, pieces(read()))  # a full disk keeps the last export whole, not a cut-off new one


def _read_snapshot(db: sqlite3.Connection, ids: list[int] | None) -> list[dict]:
    return export.chats_of(snapshot_store(db, ids), ids)


def _chats(n: int) -> str:
    return f"{n:,} chat" + ("" if n == 1 else "s")
