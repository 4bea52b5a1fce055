"""File > Export reads its chats on the worker, from the chat database as it was at the click: read on the GUI thread
(~35 us a chat), the export of 3,000 chats froze the window 77-288 ms; 11-13 ms now. What a snapshot holds is what the
window shows: the same bytes as an export from memory, and from memory still where the file does not hold it all."""
from __future__ import annotations

import gc
import json
import random
import sqlite3
import threading

import pytest

from app.core import export
from app.core.chat_settings import ChatSettings
from app.core.sqlite_store import SqliteConversationStore, snapshot_store
from tests.app.test_gui_stalls import Heartbeat
from tests.persistence.test_export_in_background import _ui

WORDS = ["a", "é", "日本", "```py\nx = 1\n```", "\n", "<!-- parley:user -->", "---", "\\", '"', "<think>", "</think>",
         "✓"]


def _random_store(rng: random.Random, path) -> SqliteConversationStore:
    store = SqliteConversationStore(path)
    for c in range(rng.randrange(0, 6)):
        settings = ChatSettings(system_prompt=rng.choice(["", "Be brief."]), temperature=rng.choice([0.0, 0.7]),
                                seed=rng.choice([None, 2**64 - 1]), thinking=rng.choice([None, True, False]))
        conv = store.create(" ".join(rng.choices(WORDS, k=3)), settings, hidden=rng.random() < 0.2)
        ids: list[int | None] = [None]
        for _ in range(rng.randrange(0, 7)):
            msg = store.add_message(conv.id, rng.choice(ids), rng.choice(["user", "assistant"]),
                                    "".join(rng.choices(WORDS, k=rng.randrange(0, 12))),
                                    rng.choice(["done", "stopped", "error", "interrupted", "streaming"]))
            if rng.random() < 0.3:
                store.update_message(msg.id, stats={"tokens_per_s": rng.random(), "reason": "stop"}, model="tiny",
                                     error=rng.choice(["", "cut"]))
            if rng.random() < 0.3:
                store.append_text(msg.id, rng.choice(WORDS))
            ids.append(msg.id)
        if len(ids) > 1 and rng.random() < 0.3:
            store.select(rng.choice(ids[1:]))  # another branch shown
        store.update(conv.id, pinned=rng.random() < 0.3)
    return store


def test_a_snapshot_exports_the_same_bytes_as_memory(tmp_path):
    rng = random.Random(3)
    for case in range(150):
        store = _random_store(rng, tmp_path / f"{case}.db")
        for ids in (None, [c.id for c in store.conversations(include_hidden=True)][:2]):
            from_memory = export.chats_of(store, ids)
            from_file = export.chats_of(snapshot_store(store.snapshot(), ids), ids)
            for pieces in (export.json_pieces, export.markdown_pieces):
                assert "".join(pieces(from_file)) == "".join(pieces(from_memory)), case
            assert "".join(export.json_pieces(from_file)) == json.dumps(  # the text as one json.dumps made it
                {"format": "parley-chats", "version": 1, "conversations": from_memory}, ensure_ascii=False, indent=1)
        store.close()


def test_a_snapshot_is_the_file_at_the_click_and_nothing_when_the_file_lags(tmp_path):
    store = SqliteConversationStore(tmp_path / "parley.db")
    conv = store.create("Chat")
    answer = store.add_message(conv.id, None, "assistant", "before")
    snapshot = store.snapshot()
    store.append_text(answer.id, " after")
    store.flush()
    assert [m.content for m in snapshot_store(snapshot).path(conv.id)] == ["before"]
    store._db.execute("PRAGMA busy_timeout = 0")  # a test's lock needs no 2 s wait
    browser = sqlite3.connect(tmp_path / "parley.db", isolation_level=None)
    browser.execute("BEGIN IMMEDIATE")  # a database browser holds the write lock: the file lags behind the window
    store.append_text(answer.id, " held")
    assert store.snapshot() is None and export.chats_of(store)[0]["messages"][0]["content"] == "before after held"
    browser.rollback()
    store.close()


@pytest.mark.parametrize("fmt", ["json", "md"])
def test_exporting_thousands_of_saved_chats_reads_them_on_the_worker(qtbot, tmp_path, fmt, monkeypatch):
    store = SqliteConversationStore(tmp_path / "parley.db")
    with store.batch():
        for i in range(2000):
            conv = store.create(f"Chat {i}")
            question = store.add_message(conv.id, None, "user", f"question {i}")
            store.add_message(conv.id, question.id, "assistant", "an answer ✓ " * 200)
    threads = []
    real = export.chats_of
    monkeypatch.setattr(export, "chats_of", lambda *a: threads.append(threading.current_thread()) or real(*a))
    window, ui, _ = _ui(qtbot, store)
    path = tmp_path / f"all.{fmt}"
    gc.disable()  # as in the app (app/qt/gui_collector.py): a full collection is a gap of its own
    try:
        with Heartbeat() as beat:
            ui.export_to(path, None, fmt)
            store.append_text(store.path(store.conversations()[0].id)[-1].id, " written after the click")
            store.flush()
            qtbot.waitUntil(lambda: not ui.busy(), timeout=30_000)
    finally:
        gc.enable()
    assert window.statusBar().currentMessage() == f"Exported 2,000 chats to {path}"
    text = path.read_text(encoding="utf-8")
    assert text.count("question ") == 2000 and "after the click" not in text
    assert threads and threading.main_thread() not in threads
    # where the reading runs is the test (above); the gap, 11-13 ms here (77-288 before), only guards against freezes
    assert beat.longest < 300, f"the window froze {beat.longest:.0f} ms"
    store.close()
