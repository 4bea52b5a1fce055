"""The WAL is checkpointed on a thread with a connection of its own, never inside the window's COMMIT: SQLite's own
checkpoint (every 1,000 pages) copied them into parley.db and synced both files inside the COMMIT that crossed the line,
on the GUI thread (an import slice's COMMIT 2-3 ms, up to 17-20 ms when it checkpointed; the import's COMMITs took
0.93-1.04 s of the GUI thread for 3,000 chats, 0.36-0.44 s now)."""
from __future__ import annotations

import threading

from app.core.checkpointer import WAL_PAGES, Checkpointer
from app.core.sqlite_store import SqliteConversationStore

ANSWER = "def f(x):\n    return x * 2  # doubles the value\n" * 180  # ~8 kB, its trigram index ~3 times that
CHATS = 400  # ~13 pages of WAL a chat: ~5 checkpoints' worth


def test_checkpoints_run_on_their_own_thread_and_keep_the_wal_short(tmp_path, monkeypatch):
    ran_on, real = [], Checkpointer._checkpoint
    monkeypatch.setattr(Checkpointer, "_checkpoint",
                        staticmethod(lambda db: ran_on.append(threading.current_thread()) or real(db)))
    db = tmp_path / "parley.db"
    store = SqliteConversationStore(db)
    assert store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # none inside the window's COMMIT
    pending = []
    for i in range(CHATS):  # as an import adds them: a batch a slice
        with store.batch():
            conv = store.create(f"Chat {i}")
            question = store.add_message(conv.id, None, "user", f"question {i}")
            store.add_message(conv.id, question.id, "assistant", ANSWER + str(i))
        pending.append(store._checkpoints.pending())
    assert max(pending) > WAL_PAGES  # the WAL did cross the line, and more than once in all
    assert len(ran_on) >= 2 and threading.main_thread() not in ran_on
    assert pending[-1] < 3 * WAL_PAGES  # without checkpoints: ~5,000 pages by now
    store.close()
    assert not (tmp_path / "parley.db-wal").exists()  # the last connection's close checkpointed the rest
    again = SqliteConversationStore(db)
    assert len(again.conversations()) == CHATS and again.search("doubles the value")
    assert again.path(again.conversations()[0].id)[-1].content == ANSWER + str(CHATS - 1)
    again.close()
