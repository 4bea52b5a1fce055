"""The search index is rewritten only where a finished message's text changed. The store's UPDATE always sets the
content, and the index took each message's whole text out and put it back on any change (its state at an answer's end,
the stats and times an import sets on each message: importing 3,000 chats of 8 kB answers spent 1.6-2.7 s there, 0.14 s
now), and at each flush of a streaming answer (a 190 kB answer: 21 ms of the GUI thread every 0.5 s; 0.5 ms now, the
answer indexed once it ends; search looks in answers still being written itself)."""
from __future__ import annotations

import sqlite3

from app.core import schema
from app.core.sqlite_store import SqliteConversationStore

ANSWER = "def f(x):\n    return x * 2  # doubles\n" * 40
OLD_TRIGGERS = """
CREATE TRIGGER message_fts_insert AFTER INSERT ON message BEGIN
    INSERT INTO message_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER message_fts_delete AFTER DELETE ON message BEGIN
    INSERT INTO message_fts(message_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER message_fts_update AFTER UPDATE OF content ON message BEGIN
    INSERT INTO message_fts(message_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO message_fts(rowid, content) VALUES (new.id, new.content);
END;
"""


def _index_rows(store: SqliteConversationStore) -> int:
    """FTS5 adds a segment (rows of message_fts_data) for each batch of index changes, never for none."""
    return store._db.execute("SELECT count(*) FROM message_fts_data").fetchone()[0]


def _index_matches_the_text(db: sqlite3.Connection) -> None:
    """FTS5's own check of an external-content index against its table: raises where they differ."""
    db.execute("INSERT INTO message_fts(message_fts, rank) VALUES ('integrity-check', 1)")


def _answer(store: SqliteConversationStore, state: str = "streaming"):
    conv = store.create("Chat")
    question = store.add_message(conv.id, None, "user", "question")
    return store.add_message(conv.id, question.id, "assistant", ANSWER, state=state)


def test_a_change_other_than_the_text_leaves_the_index_alone(tmp_path):
    store = SqliteConversationStore(tmp_path / "parley.db")
    answer = _answer(store, state="done")
    before = _index_rows(store)
    for i in range(10):
        store.update_message(answer.id, state="done", stats={"tokens": i}, created_at=float(i))
    assert _index_rows(store) == before
    store.update_message(answer.id, content="a new text entirely")
    assert _index_rows(store) > before
    assert store.search("entirely") and not store.search("doubles")  # the text that changed is indexed anew
    _index_matches_the_text(store._db)
    store.close()


def test_a_streaming_answer_is_indexed_once_it_ends_and_found_meanwhile(tmp_path):
    now = [0.0]
    store = SqliteConversationStore(tmp_path / "parley.db", clock=lambda: now[0])
    answer = _answer(store)
    before = _index_rows(store)
    for _ in range(20):  # 20 flushes of streamed text
        now[0] += 1.0
        store.append_text(answer.id, " more words streamed")
    assert _index_rows(store) == before
    assert [c.title for c in store.search("words streamed")] == ["Chat"]  # from memory while it streams
    store.update_message(answer.id, state="done")
    assert _index_rows(store) > before
    store._unfinished_with = lambda folded: set()  # the index alone now
    assert [c.title for c in store.search("words streamed")] == ["Chat"]
    _index_matches_the_text(store._db)
    cut = _answer(store)  # deleted, and its chat, while streaming: nothing to take out of the index
    store.delete(cut.conversation_id)
    _index_matches_the_text(store._db)
    store.close()


def test_a_file_indexed_before_gets_the_triggers_its_unfinished_answers_out_of_the_index(tmp_path):
    db = tmp_path / "parley.db"
    store = SqliteConversationStore(db)
    done = _answer(store, state="done")
    store.close()
    old = sqlite3.connect(db, isolation_level=None)
    for name in schema.TRIGGERS:
        old.execute(f"DROP TRIGGER {name}")
    schema.run_script(old, OLD_TRIGGERS)
    old.execute("INSERT INTO message_fts(message_fts) VALUES ('rebuild')")  # every message, as those triggers kept it
    old.execute("INSERT INTO conversation (id, title, pinned, hidden, created_at, updated_at, leaf_id, settings_json) "
                "VALUES (90, 'Cut', 0, 0, 0, 0, NULL, '{}')")
    old.execute("INSERT INTO message (id, conversation_id, parent_id, role, content, state, error, model, created_at) "
                "VALUES (91, 90, NULL, 'assistant', 'cut short mid-answer', 'streaming', '', '', 0)")  # a crash
    old.close()
    store = SqliteConversationStore(db)
    _index_matches_the_text(store._db)  # the cut answer, now interrupted, indexed once
    assert store.message(91).state == "interrupted"
    assert [c.title for c in store.search("mid-answer")] == ["Cut"]
    store.update_message(done.id, content="changed since")
    assert [c.title for c in store.search("changed since")] == ["Chat"] and not store.search("doubles")
    _index_matches_the_text(store._db)
    store.close()
