"""Another program holding parley.db's write lock (a second Parley's shell, a database browser) never freezes the
window: the first write each 10 s waited out SQLite's 2 s busy timeout on the GUI thread (40 writes in 40 s while
locked: 4 of them 2,010 ms). A write now finds the lock at once and holds its changes, the next change or flush tries
again, and the quit, the window gone, still waits for a lock let go meanwhile."""
from __future__ import annotations

import sqlite3
import threading
import time

from app.core import schema
from app.core.held_changes import held_file
from app.core.sqlite_store import SqliteConversationStore

MAX_WRITE_S = 0.5  # a loose guard against the 2 s wait (the test's structural check is the connection's own timeout)


def _browser(path) -> sqlite3.Connection:
    browser = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # let go from a timer below
    browser.execute("BEGIN IMMEDIATE")  # an edit not yet written: the write lock held until it lets go
    return browser


def test_a_write_while_another_program_holds_the_lock_does_not_wait(tmp_path):
    assert schema.BUSY_TIMEOUT_MS >= 1000  # the app's own timeout, not a test's shorter one
    db, now = tmp_path / "parley.db", [0.0]
    store = SqliteConversationStore(db, clock=lambda: now[0])
    conv = store.create("chat")
    assert store._db.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    browser = _browser(db)
    slowest = 0.0
    for i in range(12):  # one a second of the store's clock: a try each 10 s waited 2 s
        now[0] += 1.0
        start = time.perf_counter()
        store.add_message(conv.id, None, "user", f"typed {i}")
        slowest = max(slowest, time.perf_counter() - start)
    assert slowest < MAX_WRITE_S, f"a write waited {slowest * 1e3:.0f} ms"
    assert store.holding and "locked" in store.warning and held_file(db).exists()
    browser.rollback()
    store.flush()  # the window's flush timer, a second later: no 10 s to wait for
    assert store.persistent and not store.warning and not held_file(db).exists()
    store.close()
    browser.close()
    again = SqliteConversationStore(db)
    assert sorted(m.content for m in again._messages.values()) == sorted(f"typed {i}" for i in range(12))
    again.close()


def test_the_quit_still_waits_for_a_lock_let_go_meanwhile(tmp_path):
    db = tmp_path / "parley.db"
    store = SqliteConversationStore(db)
    conv = store.create("chat")
    browser = _browser(db)
    store.add_message(conv.id, None, "user", "typed while locked")
    assert store.holding
    threading.Timer(0.3, browser.rollback).start()  # the browser lets go while Parley quits
    store.close()
    browser.close()
    assert not held_file(db).exists() and not store.kept  # written into the file, not kept beside it
    again = SqliteConversationStore(db)
    assert [m.content for m in again._messages.values()] == ["typed while locked"] and not again.notice
    again.close()
