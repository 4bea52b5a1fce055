"""Checkpoints of the chat database's WAL, run on a thread with a connection of its own.

Left to SQLite, a checkpoint runs inside whichever COMMIT pushes the WAL past 1,000 pages: it copies those pages into
the database and syncs both files, on the GUI thread (a COMMIT of an import slice took up to 17 ms instead of 2-3 ms).
Under WAL a checkpoint may run from any connection while another one writes (a PASSIVE one never waits and never
blocks a writer), so the store turns its own off and starts one here once the WAL is that large.
"""
from __future__ import annotations

import sqlite3
import struct
import threading
from pathlib import Path

from app.core.wal_files import unwritable_side_file

WAL_PAGES = 1000  # SQLite's own automatic checkpoint size (PRAGMA wal_autocheckpoint)
# The WAL-index header at the start of the -shm (https://www.sqlite.org/walformat.html): frames in the WAL (mxFrame) and
# those already copied into the database (nBackfill), native byte order. The WAL file itself never shrinks.
MX_FRAME, N_BACKFILL = struct.Struct("=I"), 96


class Checkpointer:
    """`attach(db)` turns the store's connection's automatic checkpoints off; `after_commit()` starts one on a thread
    once the WAL is large; `close()` waits for one running (before the store closes or lets go of its file)."""

    def __init__(self, db_file: Path, pages: int = WAL_PAGES):
        self.file = db_file
        self._shm = db_file.with_name(db_file.name + "-shm")
        self._pages = pages
        self._thread: threading.Thread | None = None
        self._db: sqlite3.Connection | None = None  # the store's connection: the fallback where the thread failed
        self.failed = False  # the last checkpoint on the thread could not run: the store's connection runs them
        self.done = 0  # checkpoints run on the thread (tests)

    def attach(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA wal_autocheckpoint = 0")
        self._db = db

    def after_commit(self) -> None:
        """Starts a checkpoint where the WAL holds more pages than SQLite would let it and none runs (~10 us)."""
        if self._db is None or (self._thread is not None and self._thread.is_alive()) or not self._due():
            return
        if self.failed:  # as SQLite would have done it, here
            self._checkpoint(self._db)
            return
        self._thread = threading.Thread(target=self._run, name="parley-checkpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Waits for a checkpoint running; the store's connection goes back to its automatic ones."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        db, self._db = self._db, None
        if db is not None:
            try:
                db.execute(f"PRAGMA wal_autocheckpoint = {self._pages}")
            except sqlite3.Error:
                pass

    def _due(self) -> bool:
        return self.pending() >= self._pages

    def pending(self) -> int:
        """Pages written to the WAL and not yet copied into the database, as the -shm's header says (read unlocked:
        only when to start a checkpoint hangs on it); 0 where it cannot be read."""
        try:
            with open(self._shm, "rb") as shm:
                head = shm.read(N_BACKFILL + MX_FRAME.size)
        except OSError:
            return 0
        if len(head) < N_BACKFILL + MX_FRAME.size:
            return 0
        return MX_FRAME.unpack_from(head, 16)[0] - MX_FRAME.unpack_from(head, N_BACKFILL)[0]

    def _run(self) -> None:
        # -wal or -shm made unwritable: the -shm is mapped and a checkpoint writes into it (SIGBUS; wal_files.py)
        if unwritable_side_file(self.file) is not None:
            return
        try:  # mode=rw: a file deleted meanwhile is not made anew here
            db = sqlite3.connect(f"{self.file.resolve().as_uri()}?mode=rw", uri=True, isolation_level=None)
        except (sqlite3.Error, OSError):
            self.failed = True
            return
        try:
            self.failed = not self._checkpoint(db)
            self.done += not self.failed
        finally:
            db.close()  # not the last connection (the store's is open): closing checkpoints nothing

    @staticmethod
    def _checkpoint(db: sqlite3.Connection) -> bool:
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            return True
        except (sqlite3.Error, OSError):
            return False
