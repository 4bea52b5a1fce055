"""A month of daily use: long chats over the context, scrolling back through a long chat, deleting a big one,
regenerating with a fixed seed."""
from __future__ import annotations

from tests.app.helpers import configure, wait_idle

HISTORY = "the earlier steps are all done and checked " * 2  # ~90 tokens of the tiny models: a dozen overflow 512


def _chat_with_history(parley, pairs: int) -> int:
    """A chat whose earlier turns (written through the store, as a restart reads them) overflow the tiny context."""
    conv = parley.window.new_chat()
    parent = None
    for i in range(pairs):
        user = parley.store.add_message(conv, parent, "user", f"question {i}: {HISTORY}")
        parent = parley.store.add_message(conv, user.id, "assistant", f"answer {i}: {HISTORY}").id
    parley.window.open_chat(conv)
    return conv


def test_an_answer_written_without_the_oldest_messages_says_so_and_keeps_saying_it(parley, qtbot):
    """The overflow policy left the oldest messages out and only the meter's tooltip said so while the answer
    streamed; once it ended nothing did (the meter read a near-empty context under an answer that saw none of it)."""
    conv = _chat_with_history(parley, pairs=6)
    configure(parley, conv, temperature=0.0, max_tokens=4)
    told = []  # what the engine said it left out of the turn
    parley.bridge.context_usage.connect(lambda _sid, _used, _limit, dropped: told.append(dropped))
    parley.window.chat.send("and now?")
    wait_idle(parley, qtbot, conv)
    answer = parley.store.path(conv)[-1]
    left_out = told[-1]
    assert 0 < left_out < 12  # the history does overflow, as the test means
    assert answer.stats["dropped_messages"] == left_out
    shown = parley.window.chat.view.delegate.document(answer)[0].toPlainText()
    assert f"Written without the chat's {left_out} oldest messages: they do not fit its context of 512 tokens" in shown
    assert parley.service.status(conv).dropped_messages == left_out  # after the turn, from the answer's stats
    assert f"{left_out} oldest messages left out" in parley.window.chat.status.meter.toolTip()


def test_an_answer_that_saw_the_whole_chat_has_no_such_note(parley, qtbot):
    conv = _chat_with_history(parley, pairs=0)
    configure(parley, conv, temperature=0.0, max_tokens=4)
    parley.window.chat.send("hello")
    wait_idle(parley, qtbot, conv)
    answer = parley.store.path(conv)[-1]
    assert "dropped_messages" not in answer.stats
    assert "Written without" not in parley.window.chat.view.delegate.document(answer)[0].toPlainText()
