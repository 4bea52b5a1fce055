"""Changes held back while another program holds parley.db's write lock: their file and what the user is told."""
from __future__ import annotations

import sqlite3

import pytest

from app.core import schema
from app.core.sqlite_store import SqliteConversationStore


@pytest.fixture(autouse=True)
def short_busy_wait(monkeypatch):
    monkeypatch.setattr(schema, "BUSY_TIMEOUT_MS", 50)  # each locked try waits this long (2 s in the app)


def _locked_by_a_browser(path) -> sqlite3.Connection:
    """A database browser with an edit not yet written: it holds the write lock until rolled back."""
    browser = sqlite3.connect(path, isolation_level=None)
    browser.execute("BEGIN IMMEDIATE")
    return browser


@pytest.mark.parametrize("renames, said", [(1, "1 change not yet saved is kept"), (2, "2 changes not yet saved are kept")])
def test_the_quit_notice_counts_one_change_in_the_singular(tmp_path, renames, said):
    """The box at quit read '1 changes not yet saved are kept' while the start's line said '1 change'."""
    path = tmp_path / "parley.db"
    store = SqliteConversationStore(path)
    convs = [store.create(f"chat {i}") for i in range(renames)]
    browser = _locked_by_a_browser(path)
    try:
        for conv in convs:
            store.update(conv.id, title="renamed while locked")
        store.close()
    finally:
        browser.close()
    assert f"locked: {said} in parley.db.held.json" in store.notice, store.notice


# Another program (a database browser with an edit not yet written) holds SQLite's write lock until killed.
BROWSER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
"""


def _parley_holding(path, browser_locked: int, told: int) -> None:
    """A forked Parley (no second start-up of its imports): one chat written, then, once the browser holds the lock, a
    question and a streamed answer held back; it waits to be killed."""
    import os

    store = SqliteConversationStore(path)
    conv = store.create("one")
    os.write(told, b"w")
    os.read(browser_locked, 1)
    question = store.add_message(conv.id, None, "user", "my last message")
    answer = store.add_message(conv.id, question.id, "assistant", "its answer", state="streaming")
    store.append_text(answer.id, " streamed")
    store.flush()
    os.write(told, b"h" if not store.persistent else b"x")
    os.read(browser_locked, 1)


def test_changes_held_back_by_a_lock_survive_a_kill_of_parley(tmp_path):
    """They reached parley.db.held.json only at a clean quit: Parley killed (or crashed) while a browser held the lock
    lost them all. The file follows them as they are held; the next start merges them and says so."""
    import os
    import signal
    import subprocess
    import sys

    path = tmp_path / "parley.db"
    (to_child, go), (told, from_child) = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # Parley
        try:
            _parley_holding(path, to_child, from_child)
        finally:
            os._exit(0)
    browser = None
    try:
        assert os.read(told, 1) == b"w"
        browser = subprocess.Popen([sys.executable, "-c", BROWSER, str(path)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        assert browser.stdout.readline().strip() == "locked"
        os.write(go, b"g")
        assert os.read(told, 1) == b"h"  # held, not written
    finally:
        os.kill(pid, signal.SIGKILL)
        killed = os.waitpid(pid, 0)[1]
        if browser is not None:
            browser.kill()
            browser.wait()
    assert killed == signal.SIGKILL
    store = SqliteConversationStore(path)
    conv = store.conversations()[0]
    assert [m.content for m in store.path(conv.id)] == ["my last message", "its answer streamed"]  # before: []
    assert store.persistent and "held back when Parley last ran" in store.notice
    assert not (tmp_path / "parley.db.held.json").exists()  # written into the file now: merged once
    store.close()


def _damaged(text: str, damage: str) -> str:
    return {"cut short": text[: len(text) // 2], "not JSON": "{not json", "another shape": '{"statements": {"a": 1}}',
            "not a write": text.replace("INSERT INTO message", "DROP TABLE message; --")}[damage]


@pytest.mark.parametrize("damage", ["cut short", "not JSON", "another shape", "not a write"])
def test_a_held_file_that_does_not_read_is_kept_aside_and_named(tmp_path, damage):
    """It was ignored without a word, then deleted or written over at the next change a lock held: the messages in it
    vanished. It is renamed (its bytes as they were) and the start's notice says where; nothing of it is applied."""
    from app.core.held_changes import held_file, save_held

    path = tmp_path / "parley.db"
    store = SqliteConversationStore(path)
    conv = store.create("one")
    store.close()
    row = [99, conv.id, None, "user", "my held message", "done", "", None, "", 0.0]
    save_held(path, [("INSERT INTO message (id, conversation_id, parent_id, role, content, state, error, stats_json, "
                      "model, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", tuple(row))])
    bad = _damaged(held_file(path).read_text(), damage)
    held_file(path).write_text(bad)
    store = SqliteConversationStore(path)
    [aside] = tmp_path.glob("parley.db.held.json.damaged-*")
    assert aside.read_text() == bad and not held_file(path).exists()
    assert store.notice == (f"The changes held back when Parley last ran (parley.db.held.json) could not be read (cut "
                            f"short or damaged); it was kept as {aside.name}.")
    assert [c.title for c in store.conversations()] == ["one"] and store.path(conv.id) == []
    browser = _locked_by_a_browser(path)  # a change held, then saved: the file set aside stays
    store.create("two")
    browser.close()
    store.close()
    assert aside.read_text() == bad and not store.kept
    again = SqliteConversationStore(path)  # said once
    assert not again.notice and sorted(c.title for c in again.conversations()) == ["one", "two"]
    again.close()


def _held_then_killed(path, titles: list[str]) -> None:
    """A forked Parley: chat "one" written, then, while a browser holds the lock, a chat held for each title and a
    message in "one" (its row and its chat's); it ends as a kill would (no flush, no close)."""
    import os

    pid = os.fork()
    if pid == 0:
        try:
            store = SqliteConversationStore(path)
            one = store.create("one")
            _locked_by_a_browser(path)
            for title in titles:
                store.create(title)
            store.add_message(one.id, None, "user", "the last change")
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


def test_a_change_held_is_appended_not_the_whole_file_written_again(tmp_path):
    """Each change held wrote every change held so far anew on the GUI thread (5.5 ms at 1.7 MB held, 43 ms at
    10 MB): it appends its own statements now, the bytes before them untouched."""
    from app.core.held_changes import held_file

    path = tmp_path / "parley.db"
    store = SqliteConversationStore(path)
    conv = store.create("one")
    browser = _locked_by_a_browser(path)
    try:
        first = store.add_message(conv.id, None, "user", "a long question " * 1000)
        before = held_file(path).read_bytes()
        store.add_message(conv.id, first.id, "user", "a short one")
        after = held_file(path).read_bytes()
    finally:
        browser.close()
    assert after.startswith(before) and len(after) - len(before) < 1000  # the message and its chat's row
    store.close()
    again = SqliteConversationStore(path)
    assert [m.content for m in again.path(conv.id)] == ["a long question " * 1000, "a short one"]
    again.close()


def test_a_kill_midway_through_a_change_loses_that_change_alone(tmp_path):
    """A kill while the last change was being appended leaves its line cut short: the changes before it are merged at
    the next start, none of its statements, and the file is not set aside as damaged (before: all of them lost)."""
    from app.core.held_changes import held_file

    path = tmp_path / "parley.db"
    _held_then_killed(path, ["two", "three"])
    held = held_file(path).read_bytes()
    held_file(path).write_bytes(held[:-20])  # the last line as far as the kill let it be written
    store = SqliteConversationStore(path)
    assert sorted(c.title for c in store.conversations()) == ["one", "three", "two"]
    assert all(store.path(c.id) == [] for c in store.conversations())  # the message's row and its chat's: neither
    assert store.notice.startswith("2 changes held back when Parley last ran") and store.persistent
    assert sorted(p.name for p in tmp_path.iterdir() if "held" in p.name) == []  # merged: none kept, none set aside
    store.close()


def test_a_streamed_answer_held_keeps_the_file_near_the_size_of_what_it_holds(tmp_path):
    """A streamed answer re-sends its whole text each flush: appended as it is, the file grew with the square of the
    answer. Once the UPDATEs sent again outweigh the live ones (and the slack) it is written whole; it reads as the
    last text all along."""
    from app.core.held_changes import HeldJournal, held_file, latest_updates, read_held, save_held

    path = tmp_path / "parley.db"
    journal, held, sizes = HeldJournal(path, slack=4096), [], []
    insert = ("INSERT INTO message (id, content) VALUES (?, ?)", (1, ""))
    for n in range(1, 200):
        update = ("UPDATE message SET content = ? WHERE id = ?", ("word " * n, 1))
        held = latest_updates([*held, *([insert] if n == 1 else []), update])
        journal.keep(held, "locked")
        sizes.append(held_file(path).stat().st_size)
        assert read_held(path) == (held, "locked")
    whole = save_held(tmp_path / "whole.db", held, synced=False).stat().st_size
    assert max(sizes) <= 2 * whole + 4096 + len("word " * 200), sizes  # the bound, and the line appended past it
    assert sizes != sorted(sizes)  # written whole at least once


def test_statements_handed_again_as_new_tuples_are_not_appended_twice(tmp_path):
    """The journal tells the statements in its file by identity: a list built anew (the same statements, new tuples)
    is written whole, not appended after the copies already there."""
    from app.core.held_changes import HeldJournal, read_held

    path = tmp_path / "parley.db"
    journal = HeldJournal(path)
    held = [("INSERT INTO conversation (id, title) VALUES (?, ?)", (i, f"chat {i}")) for i in range(3)]
    journal.keep(held, "locked")
    again = [(sql, tuple(params)) for sql, params in held] + [("DELETE FROM conversation WHERE id = ?", (1,))]
    journal.keep(again, "locked")
    assert read_held(path) == (again, "locked")


def test_a_file_written_before_the_journal_still_reads(tmp_path):
    """Version 1 kept the changes as one JSON object: a file left by it is merged at the first start of this one."""
    import json

    from app.core.held_changes import held_file, read_held

    path = tmp_path / "parley.db"
    rows = [["UPDATE conversation SET title = ? WHERE id = ?", ["renamed", 1]]]
    held_file(path).write_text(json.dumps({"version": 1, "why": "another program had parley.db locked",
                                           "statements": rows}))
    assert read_held(path) == ([("UPDATE conversation SET title = ? WHERE id = ?", ("renamed", 1))],
                               "another program had parley.db locked")


APPEND_PAST_LIMIT = """
import resource, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from app.core.held_changes import HeldJournal, read_held
path = Path(sys.argv[1])
journal = HeldJournal(path)
held = [("INSERT INTO conversation (id, title) VALUES (?, ?)", (1, "kept"))]
journal.keep(held, "locked")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG past the limit, as a full disk's ENOSPC
resource.setrlimit(resource.RLIMIT_FSIZE, (600, resource.RLIM_INFINITY))
try:
    journal.keep([*held, ("INSERT INTO conversation (id, title) VALUES (?, ?)", (2, "x" * 2000))], "locked")
except OSError as exc:
    print("refused", exc.errno)
print(read_held(path)[0] == held)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # room again
held = [*held, ("INSERT INTO conversation (id, title) VALUES (?, ?)", (3, "next"))]
journal.keep(held, "locked")
print(read_held(path)[0] == held)
"""


def test_a_change_the_disk_takes_part_of_is_not_followed_by_others(tmp_path):
    """A full disk midway through an append leaves part of a line: the change is refused, the file reads as before
    it, and the next change writes the file whole (appended after the part line, it would not read)."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    run = subprocess.run([sys.executable, "-c", APPEND_PAST_LIMIT, str(tmp_path / "parley.db"), root],
                         capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["refused", "27", "True", "True"], run.stderr
