"""Closing chats or quitting while they stream: the partial answers are saved and the engine keeps nothing."""
from __future__ import annotations

import sqlite3

from app.core.sqlite_store import INTERRUPTED, SqliteConversationStore
from engine import events as ev
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.support.engine_client import Client

SLOTS = 4
CONFIG = EngineConfig(max_sessions=SLOTS, max_session_tokens=512, step_tokens=64, chunk_tokens=32)


def _stream(client, store, model_id, n):
    """n chats answering at once; returns session -> (conversation, answer message, turn)."""
    chats = {}
    for i in range(n):
        conv = store.create(f"chat {i}")
        user = store.add_message(conv.id, None, "user", "Tell me a long story.")
        answer = store.add_message(conv.id, user.id, "assistant", state="streaming")
        sid = client.open(model_id, params=SamplingParams(temperature=1.0, seed=i, max_tokens=400))
        chats[sid] = (conv.id, answer.id, client.send(sid, user.content))
    return chats


def _pump(client, store, chats, seen: int) -> int:
    """Feeds the events that arrived since `seen` to the store, as the GUI thread does."""
    with client.lock:
        new = client.all[seen:]
    turns = {t: a for _, a, t in chats.values()}
    for e in new:
        answer = turns.get(getattr(e, "turn_id", None))
        if answer is None:
            continue
        if isinstance(e, ev.TokenDelta):
            store.append_text(answer, e.text)
        elif isinstance(e, ev.Finished):
            store.update_message(answer, content=e.text, state="stopped" if e.reason in ("cancelled", "closed") else "done")
    return seen + len(new)


def _wait_tokens(client, chats, at_least=3):
    for _, _, turn in chats.values():
        client.wait_for(lambda e, t=turn: isinstance(e, ev.TokenDelta) and e.turn_id == t
                        and len(client.tokens(t)) >= at_least, timeout=60)


def test_closing_chats_mid_stream(tiny_models, tmp_path):
    client = Client(CONFIG)
    client.engine.start()
    model_id = client.load(tiny_models["qwen3"].gguf_path)
    store = SqliteConversationStore(tmp_path / "p.db")
    chats = _stream(client, store, model_id, 3)
    _wait_tokens(client, chats)
    for sid in chats:
        client.engine.close(sid)
    for _, _, turn in chats.values():
        assert isinstance(client.wait(turn, timeout=30), ev.Finished)
    _pump(client, store, chats, 0)
    store.close()
    assert client.engine.inspect()["sessions"] == 0
    assert client.free_slots(model_id) == SLOTS
    client.engine.shutdown()
    rows = dict(sqlite3.connect(tmp_path / "p.db").execute("SELECT id, content FROM message WHERE role = 'assistant'"))
    for _, answer, turn in chats.values():
        assert rows[answer] and rows[answer] == client.text(turn)


def test_quitting_mid_stream(tiny_models, tmp_path):
    """Quit = stop the engine and close the store without waiting for answers: they come back interrupted."""
    client = Client(CONFIG)
    client.engine.start()
    model_id = client.load(tiny_models["qwen3"].gguf_path)
    store = SqliteConversationStore(tmp_path / "p.db")
    chats = _stream(client, store, model_id, 3)
    _wait_tokens(client, chats)
    seen = _pump(client, store, chats, 0)
    client.engine.shutdown()
    _pump(client, store, chats, seen)
    saved = {a: store.message(a).content for _, a, _ in chats.values()}
    store.close()
    assert not client.engine.running
    again = SqliteConversationStore(tmp_path / "p.db")
    for answer, text in saved.items():
        msg = again.message(answer)
        assert text and msg.content == text and msg.state in (INTERRUPTED, "stopped", "done")
