"""Deleting one message and what is under it (a refused message and its answer): gone from memory, the file and its
search index, through a lock held by another program."""
from __future__ import annotations

import sqlite3

import pytest

from app.core import schema
from app.core.sqlite_store import SqliteConversationStore


@pytest.fixture(autouse=True)
def short_busy_wait(monkeypatch):
    monkeypatch.setattr(schema, "BUSY_TIMEOUT_MS", 50)  # each locked try waits this long (2 s in the app)


def _rows(path) -> list[tuple]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT id, role, content, state FROM message ORDER BY id").fetchall()
    finally:
        db.close()


def _chat(store):
    """hi -> hello -> more -> (an answer streaming, its text not yet flushed)."""
    conv = store.create()
    u1 = store.add_message(conv.id, None, "user", "hi")
    a1 = store.add_message(conv.id, u1.id, "assistant", "hello")
    u2 = store.add_message(conv.id, a1.id, "user", "more words")
    a2 = store.add_message(conv.id, u2.id, "assistant", state="streaming")
    store.append_text(a2.id, "streamed")
    return conv, u1, a1, u2, a2


def test_a_deleted_message_and_its_answer_leave_no_row_and_a_reopen_shows_the_same(tmp_path):
    path = tmp_path / "parley.db"
    store = SqliteConversationStore(path, flush_interval_s=60)
    conv, u1, a1, u2, a2 = _chat(store)
    assert store.delete_message(u2.id) == [a2.id, u2.id]  # under it first
    assert store.path(conv.id) == [u1, a1] and store.children(conv.id, a1.id) == []  # the branch ends at its parent
    assert not store.has_message(u2.id) and not store.has_message(a2.id)
    store.flush()  # the streamed text of the answer deleted is not written back
    assert _rows(path) == [(u1.id, "user", "hi", "done"), (a1.id, "assistant", "hello", "done")]
    assert store.search("more words") == [] and store.search("streamed") == []
    store.close()
    again = SqliteConversationStore(path)
    try:
        assert [m.id for m in again.path(conv.id)] == [u1.id, a1.id] and again.children(conv.id, a1.id) == []
        assert again.search("more words") == []
    finally:
        again.close()


def test_a_delete_held_by_a_lock_is_written_once_the_lock_goes(tmp_path):
    path = tmp_path / "parley.db"
    store = SqliteConversationStore(path)
    conv, u1, a1, u2, _a2 = _chat(store)
    store.flush()
    browser = sqlite3.connect(path, isolation_level=None)
    browser.execute("BEGIN IMMEDIATE")  # a database browser with an edit not yet written
    try:
        store.delete_message(u2.id)
        assert store.holding and len(_rows(path)) == 4
    finally:
        browser.close()
    store.flush()
    assert [r[0] for r in _rows(path)] == [u1.id, a1.id]
    store.close()
