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
