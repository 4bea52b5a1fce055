"""Changes a locked chat database holds back: kept in a file beside it, merged in at the next start.

While another program (a database browser) holds SQLite's write lock, the store keeps its changes as the statements
that would write them; quitting (or a crash) then lost them. They are saved as JSON next to the database as they are
held, and replayed at the next start onto a copy of the file in memory (what the window shows), then written to the
file like any held change.

The file is JSON lines: a header ({"version": 2, "why": ..., "lines": N}), then lines of [[sql, params], ...]: the first
N written whole with the header, one a statement; then one a change, appended as it is held (HeldJournal). A kill
mid-append leaves the last line cut short: that change is dropped, not the file.
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.core.atomic_file import write_text_whole

WRITES = ("INSERT", "UPDATE", "DELETE")  # the only statements the store holds; anything else in the file is refused
VERSION = 2  # JSON lines; version 1 (one JSON object, written whole) is still read


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
    _write_whole(target, why, list(map(_row, statements)), synced)
    return target


def _write_whole(target: Path, why: str, rows: list[str], synced: bool) -> None:
    header = json.dumps({"version": VERSION, "why": why, "lines": len(rows)}) + "\n"
    write_text_whole(target, [header, *(f"[{row}]\n" for row in rows)], synced)


def _row(statement: tuple[str, tuple]) -> str:
    return json.dumps([statement[0], list(statement[1])])  # ASCII: its length is its size in bytes


@dataclass(slots=True)
class HeldJournal:
    """The held changes' file following the store's held list: a change appends its own statements (0.03 / 0.06 / 0.25
    ms on the GUI thread at 0.1 / 1.7 / 10 MB held; rewriting it whole took 0.5 / 6 / 45 ms). Written whole when it is
    new, was changed by anything else, or holds more UPDATEs sent again since (a streamed answer re-sends its whole text
    each flush) than live ones."""

    db_file: Path
    slack: int = 1 << 20  # bytes of UPDATEs sent again that may wait in the file beyond its live bytes
    _sizes: dict[int, int] = field(default_factory=dict, init=False)  # id() of each statement in the file -> its bytes
    _kept: list = field(default_factory=list, init=False)  # those statements, alive so no other object takes their id
    _why: str = field(default="", init=False)
    _end: tuple[int, int, int] | None = field(default=None, init=False)  # the file's (device, inode, size) as left

    def keep(self, statements: list[tuple[str, tuple]], why: str) -> Path:
        """Puts `statements` (all held, oldest first; later ones may drop earlier UPDATEs of their rows) in the file;
        those it holds already are told by identity (the store's list keeps its tuples). Raises OSError as a write
        would."""
        target = held_file(self.db_file)
        ids = list(map(id, statements))
        known = self._known_prefix(ids, why, target)
        try:
            sizes = self._append(target, statements[known:]) if known is not None else None
        except OSError:
            sizes = None  # written whole below
        if sizes is None:
            known, sizes = 0, self._rewrite(target, statements, why)
        kept = dict(zip(ids[:known], map(self._sizes.__getitem__, ids[:known])))  # UPDATEs sent again drop out
        self._sizes = {**kept, **dict(zip(ids[known:], sizes))}
        self._kept, self._why = list(statements), why
        return target

    def _known_prefix(self, ids: list[int], why: str, target: Path) -> int | None:
        """How many of the statements lead the list already in the file; None where it must be written whole."""
        if why != self._why or self._end is None or self._end != _where(target):
            return None
        known = len(ids)
        while known and ids[known - 1] not in self._sizes:
            known -= 1
        if not all(map(self._sizes.__contains__, ids[:known])) or (self._sizes and not known):
            return None  # a new statement before ones in the file (their order would differ), or none of them kept
        live = sum(map(self._sizes.__getitem__, ids[:known]))
        return known if self._end[2] <= 2 * live + self.slack else None

    def _append(self, target: Path, statements: list[tuple[str, tuple]]) -> list[int]:
        if not statements:
            return []
        rows = list(map(_row, statements))
        data = f"[{','.join(rows)}]\n".encode("ascii")  # one line: a change torn by a kill is dropped whole
        fd = os.open(target, os.O_WRONLY | os.O_APPEND)
        try:
            if os.write(fd, data) != len(data):
                raise OSError("the held changes' file took part of a change")
            st = os.fstat(fd)
            self._end = (st.st_dev, st.st_ino, st.st_size)
        finally:
            os.close(fd)
        return [len(row) + 1 for row in rows]

    def _rewrite(self, target: Path, statements: list[tuple[str, tuple]], why: str) -> list[int]:
        self._end, rows = None, list(map(_row, statements))  # a part line left by an append is never appended to
        _write_whole(target, why, rows, synced=False)
        self._end = _where(target)
        return [len(row) + 3 for row in rows]


def _where(target: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(target)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size


def read_held(db_file: Path) -> tuple[list[tuple[str, tuple]], str]:
    """The statements kept when Parley last ran (an UPDATE sent again later: once) and why they were held ("" from a
    file without it); none where there is no file. ValueError where it does not read (cut short within what was
    written whole, not JSON, another shape, a statement other than the store's writes), OSError where it cannot be
    opened. A last line cut short (a kill mid-append) is dropped."""
    try:
        text = held_file(db_file).read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], ""
    head, _, rest = text.partition("\n")
    data = json.loads(head)
    if isinstance(data, dict) and "statements" in data:  # version 1: one object, written whole
        rows, why = data.get("statements"), data.get("why")
    elif isinstance(data, dict) and isinstance(data.get("lines"), int):
        rows, why = _journal_rows(rest.split("\n"), data["lines"]), data.get("why")
    else:
        raise ValueError("not the changes Parley keeps there")
    if not isinstance(rows, list) or not all(_is_write(row) for row in rows):
        raise ValueError("not the changes Parley keeps there")
    return latest_updates([(sql, tuple(params)) for sql, params in rows]), why if isinstance(why, str) else ""


def _journal_rows(lines: list[str], whole: int) -> list:
    """The statements in a journal's lines after its header (the last one unterminated: "" where the file ends whole);
    ValueError where fewer than the `whole` lines written with the header are there, or a line is not a list."""
    complete = lines[:-1]  # a change counts once its newline is written
    if len(complete) < whole:
        raise ValueError("cut short")
    changes = [json.loads(line) for line in complete]
    if not all(isinstance(change, list) for change in changes):
        raise ValueError("not the changes Parley keeps there")
    return [row for change in changes for row in change]


def latest_updates(statements: list[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
    """`statements` with only the last UPDATE of each row (streamed text held back re-sends the whole message)."""
    seen, out = set(), []
    for statement in reversed(statements):  # the same objects: HeldJournal tells those in its file by them
        sql, params = statement
        key = (sql, params[-1] if params else None)  # UPDATEs end with the row's id
        if sql.startswith("UPDATE") and key in seen:
            continue
        seen.add(key)
        out.append(statement)
    return out[::-1]


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
