"""A reasoning model's answer in the app: what Copy gives for an answer cut short while it was still thinking."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QGuiApplication

from app.core.reasoning import copied_text


@pytest.mark.parametrize("text, copied", [
    ("<think>\nPlan.\n</think>\n\n**4**", "**4**"),  # the reply, without its thought
    ("<think>\nStill planning", "Still planning"),  # cut while thinking: the thought, not nothing
    ("Plan.\n</think>\n\n", "Plan."),  # an R1 distill's text whose reply never came
    ("<think>\n\n</think>\n\nJust 4.", "Just 4."),
    ("Just 4.", "Just 4."),
])
def test_copy_gives_the_reply_or_else_the_thought(text, copied):
    assert copied_text(text) == copied


def test_copying_an_answer_cut_while_thinking_does_not_empty_the_clipboard(parley):
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "prove it")
    answer = store.add_message(conv, user.id, "assistant", "<think>\nFirst, the base case.")
    store.update_message(answer.id, stats={"reason": "length"})
    w.open_chat(conv)
    QGuiApplication.clipboard().setText("something the user had copied")
    w.chat.view.activate(store.message(answer.id), "copymsg:")
    assert QGuiApplication.clipboard().text() == "First, the base case."


@pytest.mark.parametrize("content, state, said", [
    ("<think>\nTwo plus two", "streaming", "Assistant, thinking"),  # the reply has not begun: not a silent message
    ("<think>\nTwo plus two", "done", "Assistant, cut short while thinking"),
    ("<think>\nTwo plus two.\n</think>\n\n4", "done", "Assistant, thought for 3 words: 4"),
    ("<think>\n\n</think>\n\n4", "done", "Assistant: 4"),  # thinking off: no thought to mention
])
def test_a_screen_reader_hears_that_the_model_thinks(content, state, said):
    from app.core.conversations import Message
    from app.core.message_html import accessible_text

    msg = Message(id=1, conversation_id=1, parent_id=None, role="assistant", content=content, state=state)
    assert accessible_text(msg, 1, 1) == said
