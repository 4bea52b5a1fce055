"""SQLite's -wal and -shm files beside the chat database, when they cannot be written (made immutable with chattr +i,
or read-only and another user's). The -shm is mapped: a write into it then kills the process with SIGBUS, at the next
commit or at close; a -wal that cannot be written failed the commit ("disk I/O error") and every later change was lost
at quit."""
from __future__ import annotations

import ctypes
import os
import sqlite3
from pathlib import Path

SUFFIXES = ("-wal", "-shm")


def unwritable_side_file(db_file: Path) -> Path | None:
    """The first of the database's -wal and -shm files that is there and cannot be written; None where all can."""
    for suffix in SUFFIXES:
        side = db_file.with_name(db_file.name + suffix)
        if side.exists() and not os.access(side, os.W_OK):  # access() says no for an immutable file, even to root
            return side
    return None


def left_open(db: sqlite3.Connection) -> None:
    """Keeps `db` from ever being closed, even at the interpreter's exit: closing checkpoints through the mapped -shm,
    which kills the process when that file cannot be written. Left open, its WAL is read back at the next start, as
    after a crash: nothing committed is lost."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(db))
