"""A large JSON export imports without freezing the window: json.loads parsed the whole file in one call on the worker,
holding the GIL (and the GUI thread with it) for as long: the longest gap grew with the file, 58 ms at 12 MB, 91 ms at
24 MB; 16-17 ms for both now, parsed a message at a time from 1 MiB pieces."""
from __future__ import annotations

import gc
import json

from app.core import export
from app.core.conversations import ConversationStore
from tests.app.test_gui_stalls import Heartbeat
from tests.persistence.test_export_in_background import _ui

ANSWER = ('Here is the code:\n\n```python\ndef f(x):\n    return "value: " + str(x)  # naïve — ok\n```\n\n'
          'The "answer" is 42 ✓. ') * 60
FILE_MB = 24
# automatic collection off, as in the app (app/qt/gui_collector.py): a full collection is its own gap. The decoder's
# longest call is the test; the gap (16-17 ms here, 91 before) only guards against freezes on a loaded machine
MAX_GAP_MS = 300


def test_a_large_json_export_is_parsed_a_message_at_a_time_and_the_window_keeps_answering(qtbot, tmp_path, monkeypatch):
    chat = json.dumps({"title": "Chat", "leaf": 1, "messages": [
        {"id": 0, "parent": None, "role": "user", "content": "question"},
        {"id": 1, "parent": 0, "role": "assistant", "content": ANSWER}]}, ensure_ascii=False, indent=1)
    count = (FILE_MB << 20) // len(chat.encode())
    path = tmp_path / "big.json"
    path.write_text('{"format": "parley-chats", "version": 1, "conversations": [' + ",".join([chat] * count) + "]}",
                    encoding="utf-8")
    longest_call, real = [0], json.JSONDecoder.raw_decode

    def raw_decode(self, s, idx=0):  # json.loads comes here too, with the whole text
        value, end = real(self, s, idx)
        longest_call[0] = max(longest_call[0], end - idx)
        return value, end
    monkeypatch.setattr(json.JSONDecoder, "raw_decode", raw_decode)
    window, ui, _ = _ui(qtbot, ConversationStore())
    got = []
    gc.disable()
    try:
        with Heartbeat() as beat:
            ui.import_from(path, got.append)
            qtbot.waitUntil(lambda: bool(got), timeout=30_000)
    finally:
        gc.enable()
    assert len(got[0]) == count and window.statusBar().currentMessage() == f"Imported {count:,} chats from {path}"
    assert longest_call[0] < 2 * len(ANSWER)  # a message at most, not the file
    assert beat.longest < MAX_GAP_MS, f"the window froze {beat.longest:.0f} ms"


def test_a_markdown_export_is_read_a_chat_at_a_time(monkeypatch):
    """One split of the whole text (41-47 ms of a 25 MB file, the GIL held) became a chat at a time: each chat is read
    as soon as the next one begins, long before the last piece of the file is decoded."""
    store = ConversationStore()
    for i in range(40):
        conv = store.create(f"Chat {i}")
        store.add_message(conv.id, None, "user", f"question {i}\r\n\n---\n\n# not a chat")
    text = export.export_markdown(store).replace("\n", "\r\n")  # saved again with Windows line ends
    taken, seen = [0], []

    def pieces():
        for i in range(0, len(text), 100):
            taken[0] += 1
            yield text[i:i + 100]
    real = export._markdown_chat
    monkeypatch.setattr(export, "_markdown_chat", lambda block: seen.append(taken[0]) or real(block))
    chats = export.markdown_chats(pieces())
    assert [c["title"] for c in chats] == [f"Chat {i}" for i in range(39, -1, -1)]
    assert chats[0]["messages"][0]["content"] == "question 39\r\n\n---\n\n# not a chat"
    assert seen[0] <= 3 and seen == sorted(seen) and taken[0] == -(-len(text) // 100)
