"""Changes a locked chat database holds back: kept in a file beside it, merged in at the next start.

While another program (a database browser) holds SQLite's write lock, the store keeps its changes as the statements
that would write them; quitting (or a crash) then lost them. They are saved as JSON next to the database as they are
held, and replayed at the next start onto a copy of the file in memory (what the window shows), then written to the
file like any held change.
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from pathlib import Path

from app.core.atomic_file import write_text_whole

WRITES = ("INSERT", "UPDATE", "DELETE")  # the only statements the store holds; anything else in the file is refused


def counted(count: int) -> tuple[str, str]:
    """('1 change', 'is') or ('3 changes', 'are'): the one wording rule of every held-changes notice."""
    return (f"{count} change", "is") if count == 1 else (f"{count} changes", "are")


def held_file(db_file: Path) -> Path:
    return db_file.with_name(db_file.name + ".held.json")


def save_held(db_file: Path, statements: list[tuple[str, tuple]], synced: bool = True, why: str = "") -> Path:
    """Writes `statements` whole next to the database, with `why` they could not be written ("another program had
    parley.db locked"), which the next start says; raises OSError as the write would. `synced` False: as they are
    held (whole after a kill; atomic_file.py), True at quit (after a power cut too)."""
    target = held_file(db_file)
    rows = [[sql, list(p)] for sql, p in statements]
    write_text_whole(target, json.dumps({"version": 1, "why": why, "statements": rows}), synced)
    return target


def read_held(db_file: Path) -> tuple[list[tuple[str, tuple]], str]:
    """The statements kept when Parley last ran and why they were held ("" from a file without it); none where there
    is no file. ValueError where it does not read (cut short, not JSON, another shape, a statement other than the
    store's writes), OSError where it cannot be opened."""
    try:
        text = held_file(db_file).read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], ""
    data = json.loads(text)
    rows = data.get("statements") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(_is_write(row) for row in rows):
        raise ValueError("not the changes Parley keeps there")
    why = data.get("why")
    return [(sql, tuple(params)) for sql, params in rows], why if isinstance(why, str) else ""


def _is_write(row) -> bool:
    return (isinstance(row, list) and len(row) == 2 and isinstance(row[0], str) and isinstance(row[1], list)
            and row[0].lstrip().upper().startswith(WRITES))


def set_aside(db_file: Path) -> Path:
    """Renames a held file that does not read (never deleted: the messages in it may still be read by hand)."""
    held, stamp = held_file(db_file), time.strftime("%Y%m%d-%H%M%S")
    aside = held.with_name(f"{held.name}.damaged-{stamp}")
    for n in range(2, 100):  # another set aside within the same second is not written over
        if not aside.exists():
            break
        aside = held.with_name(f"{held.name}.damaged-{stamp}-{n}")
    os.replace(held, aside)
    return aside


def forget_held(db_file: Path) -> None:
    with contextlib.suppress(OSError):  # a folder made read-only since it was written: nothing more to do
        held_file(db_file).unlink(missing_ok=True)


def replay(db: sqlite3.Connection, statements: list[tuple[str, tuple]]) -> tuple[sqlite3.Connection, list]:
    """A copy of `db` in memory with `statements` applied, and those that applied: one that no longer fits the file
    (a row a browser deleted since, a row already written before a crash) is skipped, not the whole lot."""
    copy = sqlite3.connect(":memory:", isolation_level=None)
    db.backup(copy)
    copy.execute("PRAGMA foreign_keys = ON")
    applied = []
    for sql, params in statements:
        try:
            copy.execute(sql, params)
            applied.append((sql, params))
        except sqlite3.Error:
            pass
    return copy, applied
