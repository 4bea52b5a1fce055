"""SqliteConversationStore: same behaviour as the in-memory store, survives a reopen, degrades to memory."""
from __future__ import annotations

import inspect
import sqlite3

import pytest

from app.core import schema
from app.core.chat_settings import ChatSettings
from app.core.conversations import ConversationStore
from app.core.sqlite_store import INTERRUPTED, SqliteConversationStore

READ_ONLY_METHODS = {"get", "has", "conversations", "has_message", "message", "children", "path", "versions", "search"}


def _chat(store):
    conv = store.create()
    u1 = store.add_message(conv.id, None, "user", "hi")
    a1 = store.add_message(conv.id, u1.id, "assistant", "hello")
    u2 = store.add_message(conv.id, a1.id, "user", "more")
    a2 = store.add_message(conv.id, u2.id, "assistant", "sure")
    return conv, u1, a1, u2, a2


def _snapshot(store) -> list:
    out = []
    for conv in store.conversations(include_hidden=True):
        msgs = sorted((m for m in store._messages.values() if m.conversation_id == conv.id), key=lambda m: m.id)
        out.append((conv.id, conv.title, conv.pinned, conv.hidden, conv.leaf_id, conv.settings, conv.created_at,
                    conv.updated_at, [(m.id, m.parent_id, m.role, m.content, m.state, m.error, m.stats, m.model,
                                       m.created_at) for m in msgs]))
    return out


def test_every_changing_method_is_written_through():
    """A method added to ConversationStore that changes state must be overridden here too."""
    public = {n for n, f in inspect.getmembers(ConversationStore, inspect.isfunction) if not n.startswith("_")}
    own = {n for n in vars(SqliteConversationStore) if not n.startswith("_")}
    assert public - READ_ONLY_METHODS <= own, public - READ_ONLY_METHODS - own


def test_tree_branches_and_reopen(tmp_path):
    store = SqliteConversationStore(tmp_path / "p.db")
    conv, u1, a1, u2, a2 = _chat(store)
    a1b = store.add_message(conv.id, u1.id, "assistant", "hey")
    assert store.path(conv.id) == [u1, a1b] and store.versions(a1b) == [a1, a1b]
    store.select(a1.id)
    assert store.path(conv.id) == [u1, a1, u2, a2]
    store.update(conv.id, title="Greetings", pinned=True, settings=ChatSettings(temperature=0.2, seed=3))
    store.update_message(a2.id, stats={"reason": "stop", "tokens_per_s": 12.5}, model="tiny")
    other = store.create("Shopping list", hidden=True)
    store.add_message(other.id, None, "user", "eggs")
    before = _snapshot(store)
    store.close()

    again = SqliteConversationStore(tmp_path / "p.db")
    assert _snapshot(again) == before
    assert [m.content for m in again.path(conv.id)] == ["hi", "hello", "more", "sure"]
    new = again.create()
    assert new.id > max(m[0] for c in before for m in c[8])  # ids never collide with stored ones
    again.delete(conv.id)
    again.close()
    assert sorted(c[0] for c in _snapshot(SqliteConversationStore(tmp_path / "p.db"))) == [other.id, new.id]
    db = sqlite3.connect(tmp_path / "p.db")
    assert db.execute("SELECT count(*) FROM message WHERE conversation_id = ?", (conv.id,)).fetchone() == (0,)


def test_streamed_text_is_flushed_on_a_clock_and_on_state_changes(tmp_path):
    now = [0.0]
    store = SqliteConversationStore(tmp_path / "p.db", flush_interval_s=0.5, clock=lambda: now[0])
    conv = store.create()
    u = store.add_message(conv.id, None, "user", "hi")
    a = store.add_message(conv.id, u.id, "assistant", state="streaming")
    raw = sqlite3.connect(tmp_path / "p.db")
    stored = lambda: raw.execute("SELECT content, state FROM message WHERE id = ?", (a.id,)).fetchone()
    store.append_text(a.id, "Hel")
    assert stored() == ("", "streaming")  # not yet: less than the interval
    now[0] = 0.6
    store.append_text(a.id, "lo")
    assert stored() == ("Hello", "streaming")
    store.append_text(a.id, "!")
    store.update_message(a.id, state="done")
    assert stored() == ("Hello!", "done")


def test_unfinished_answers_come_back_interrupted(tmp_path):
    store = SqliteConversationStore(tmp_path / "p.db", flush_interval_s=0)
    conv = store.create()
    u = store.add_message(conv.id, None, "user", "hi")
    a = store.add_message(conv.id, u.id, "assistant", state="streaming")
    store.append_text(a.id, "partial ans")
    waiting = store.add_message(conv.id, u.id, "assistant", state="waiting")
    del store  # no close: as if the process died
    again = SqliteConversationStore(tmp_path / "p.db")
    assert sorted(again.recovered) == [a.id, waiting.id]
    assert again.message(a.id).state == INTERRUPTED and again.message(a.id).content == "partial ans"
    assert again.path(conv.id)[-1].id == waiting.id


def test_search_uses_fts_and_short_needles_fall_back(tmp_path):
    store = SqliteConversationStore(tmp_path / "p.db")
    assert store.has_fts
    conv, *_ = _chat(store)
    other = store.create("Shopping list")
    store.add_message(other.id, None, "user", 'Größe "quoted" 100%_x')
    assert store.search("SURE") == [conv] and store.search("shop") == [other]
    assert store.search('"quoted"') == [other] and store.search("100%_") == [other]
    assert store.search("hi") == [conv]  # two characters: below the trigram index, searched in memory
    assert store.search("nothing like it") == []
    store.delete(conv.id)
    assert store.search("sure") == []


def test_migrations_run_in_order_and_a_newer_file_is_not_written(tmp_path):
    path = tmp_path / "p.db"
    db = schema.connect(path)
    schema.MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO conversation VALUES (7, 'old', 0, 0, 1.0, 1.0, NULL, '{}')")
    db.close()
    store = SqliteConversationStore(path)
    assert store.get(7).title == "old" and store.persistent
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == schema.VERSION
    store.close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {schema.VERSION + 1}")
    db.close()
    newer = SqliteConversationStore(path)
    assert not newer.persistent and "schema version" in newer.warning and newer.get(7).title == "old"


def test_read_only_file_keeps_chats_in_memory(tmp_path, monkeypatch):
    path = tmp_path / "p.db"
    store = SqliteConversationStore(path)
    conv, *_ = _chat(store)
    store.close()
    real = schema.connect
    monkeypatch.setattr(schema, "connect", lambda p, read_only=False: real(p, read_only=True))
    store = SqliteConversationStore(path)
    warnings = []
    store.on_warning = warnings.append
    assert [m.content for m in store.path(conv.id)][-1] == "sure"
    new = store.create("kept in memory")
    store.add_message(new.id, None, "user", "still works")
    assert not store.persistent and "read-only" in store.warning and warnings == [store.warning]
    assert store.path(new.id)[0].content == "still works"


def test_data_folder_that_cannot_exist(tmp_path):
    blocker = tmp_path / "data"
    blocker.write_text("a file where the folder should be")
    store = SqliteConversationStore(blocker / "parley.db")
    assert not store.persistent and "cannot be saved" in store.warning
    assert f"({blocker} is a file, not a folder)" in store.warning  # it read "([Errno 17] File exists: …)"
    nested = SqliteConversationStore(blocker / "deeper" / "parley.db")
    assert f"({blocker} is a file, not a folder)" in nested.warning
    conv = store.create()
    store.add_message(conv.id, None, "user", "hi")
    assert store.search("hi") == [conv]


def _answer_on_a_full_disk(store: SqliteConversationStore):
    """A chat whose streaming answer of 200,000 characters filled the disk: (the chat, the answer)."""
    conv = store.create()
    a = store.add_message(conv.id, None, "assistant", state="streaming")
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 2}")  # what a full disk looks like to SQLite
    for _ in range(200):
        store.append_text(a.id, "x" * 1000)
    assert not store.persistent and "disk is full" in store.warning
    return conv, a


def test_full_disk_mid_answer(tmp_path):
    store = SqliteConversationStore(tmp_path / "p.db", flush_interval_s=0)
    conv, a = _answer_on_a_full_disk(store)
    assert len(store.message(a.id).content) == 200_000
    store.update_message(a.id, state="done")  # keeps working in memory
    reopened = SqliteConversationStore(tmp_path / "p.db")
    assert reopened.persistent and reopened.has(conv.id)


def test_text_streamed_while_the_disk_was_full_is_saved_once_there_is_room(tmp_path):
    """The first write that found the disk full closed the file for the rest of the session: the app on a 40 MB
    tmpfs filled mid-answer, then freed, kept 24 of the answer's 1,918 characters and nothing after. The changes now
    wait, as for a lock, and go in at the first try after there is room."""
    now = [0.0]
    store = SqliteConversationStore(tmp_path / "p.db", flush_interval_s=0, clock=lambda: now[0])
    conv, a = _answer_on_a_full_disk(store)
    store._db.execute("PRAGMA max_page_count = 1000000")  # room again
    now[0] += 11  # past the wait between tries
    store.update_message(a.id, state="done")
    assert store.persistent and store.warning == ""
    store.close()
    reopened = SqliteConversationStore(tmp_path / "p.db")
    assert reopened.message(a.id).content == "x" * 200_000 and reopened.message(a.id).state == "done"


def test_damaged_file_is_kept_aside(tmp_path):
    path = tmp_path / "p.db"
    path.write_bytes(b"this is not a database" * 100)
    store = SqliteConversationStore(path)
    assert store.persistent and "damaged" in store.warning
    assert list(tmp_path.glob("p.db.damaged-*"))
    store.create()
    store.close()
    assert len(SqliteConversationStore(path).conversations()) == 1


def test_compare_groups_persist(tmp_path):
    store = SqliteConversationStore(tmp_path / "p.db")
    a, b = store.create(hidden=True), store.create(hidden=True)
    gid = store.add_compare_group([a.id, b.id], "temps")
    store.close()
    again = SqliteConversationStore(tmp_path / "p.db")
    assert again.compare_groups() == {gid: [a.id, b.id]}
    again.delete(a.id)
    assert again.compare_groups() == {gid: [b.id]}
    again.delete_compare_group(gid)
    assert again.compare_groups() == {}


def _many_chats(store, chats: int, messages: int, settings: ChatSettings | None = None) -> list[int]:
    ids = []
    with store.batch():
        for i in range(chats):
            conv = store.create(f"chat {i}", settings)
            parent = None
            for k in range(messages):
                text = f"chat {i} message {k}: " + " ".join(f"w{(i * 31 + k * 7 + j) % 997}" for j in range(40))
                parent = store.add_message(conv.id, parent, "user" if k % 2 == 0 else "assistant", text).id
            ids.append(conv.id)
    return ids


def test_opening_reads_each_distinct_settings_once_and_chats_keep_their_own(tmp_path, monkeypatch):
    """Reading settings validates every field apart (1.4 ms a chat, 2.8 s of opening 2,000 chats): chats that share
    their settings read them once, and each still gets a copy of its own."""
    store = SqliteConversationStore(tmp_path / "p.db")
    ids = _many_chats(store, 30, 1) + _many_chats(store, 20, 1, ChatSettings(temperature=0.2, seed=5))
    store.close()
    reads = []
    real = ChatSettings.readable.__func__
    monkeypatch.setattr(ChatSettings, "readable", classmethod(lambda cls, data, *more: reads.append(data) or
                                                               real(cls, data, *more)))
    again = SqliteConversationStore(tmp_path / "p.db")
    assert len(reads) == 2
    assert [again.get(i).settings for i in ids] == [ChatSettings()] * 30 + [ChatSettings(temperature=0.2, seed=5)] * 20
    again.get(ids[0]).settings.temperature = 1.5
    assert again.get(ids[1]).settings.temperature == ChatSettings().temperature


def test_deleting_most_chats_shrinks_the_file_on_close(tmp_path):
    """Deleted chats' pages and their search index entries are given back when the store closes: the file shrank
    never (a freed page is only marked free, and the index only records the removal)."""
    path = tmp_path / "p.db"
    store = SqliteConversationStore(path)
    ids = _many_chats(store, 120, 10)
    store.close()
    full = path.stat().st_size
    store = SqliteConversationStore(path)
    for conv_id in ids[:90]:
        store.delete(conv_id)
    kept = _snapshot(store)
    store.close()
    assert path.stat().st_size < 0.5 * full
    again = SqliteConversationStore(path)
    assert _snapshot(again) == kept
    assert [c.id for c in again.search("message 3: w")] == [c.id for c in again.conversations()]
    assert again.search("chat 5 message") == []  # a deleted chat's text is not found


def test_deleting_a_chat_finds_each_messages_replies_by_index(tmp_path):
    """The parent_id cascade looked each deleted message's replies up by scanning every message (7-14 s for a
    500-message chat among 2,000 chats); a file from before the index gets it when opened."""
    path = tmp_path / "p.db"
    store = SqliteConversationStore(path)
    ids = _many_chats(store, 3, 4)
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP INDEX IF EXISTS message_parent")
    db.commit()
    db.close()
    store = SqliteConversationStore(path)
    plan = store._db.execute("EXPLAIN QUERY PLAN SELECT id FROM message WHERE parent_id = ?", (1,)).fetchall()
    assert any("USING COVERING INDEX message_parent" in row[-1] or "USING INDEX message_parent" in row[-1]
               for row in plan), plan
    store.delete(ids[0])
    assert sorted(c.id for c in store.conversations()) == sorted(ids[1:])
