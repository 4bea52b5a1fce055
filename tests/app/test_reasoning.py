"""A reasoning model's thought: streamed in view, folded away once the reply begins, unfolded on request; Copy copies
the reply. The split itself for every form models write."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint
from PySide6.QtGui import QGuiApplication

from app.core.reasoning import Reasoning, split_reasoning

THOUGHT = "The user wants a number.\nTwo plus two is four."


@pytest.mark.parametrize("text, want", [
    (f"<think>\n{THOUGHT}\n</think>\n\n**4**", Reasoning(THOUGHT, "**4**", False)),  # Qwen3, QwQ
    (f"{THOUGHT}\n</think>\n\n4", Reasoning(THOUGHT, "4", False)),  # an R1 distill: its prompt opened the tag
    (f"[THINK]{THOUGHT}[/THINK]4", Reasoning(THOUGHT, "4", False)),  # Magistral
    (f"  <think>{THOUGHT}", Reasoning(THOUGHT, "", True)),  # still thinking (or cut short)
    ("<think>\n\n</think>\n\n4", Reasoning("", "4", False)),  # Qwen3 with thinking turned off
    ("Just 4.", Reasoning(None, "Just 4.", False)),
    ("I write <think> tags in prose", Reasoning(None, "I write <think> tags in prose", False)),
    ("a <think>b</think> c", Reasoning(None, "a <think>b</think> c", False)),  # not at the start: prose
])
def test_split(text, want):
    assert split_reasoning(text) == want


def test_a_thought_streams_in_view_then_folds_and_unfolds(parley):
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "2+2?")
    answer = store.add_message(conv, user.id, "assistant", f"<think>\n{THOUGHT}", state="streaming")
    w.open_chat(conv)
    view = w.chat.view
    text = view.delegate.document(answer)[0].toPlainText()
    assert "Thinking…" in text and "Two plus two is four." in text and "<think>" not in text
    store.update_message(answer.id, content=answer.content + "\n</think>\n\n**4**", state="done")
    answer = store.message(answer.id)
    text = view.delegate.document(answer)[0].toPlainText()
    assert "Thought for 10 words" in text and "Two plus two" not in text and text.rstrip().endswith("4")
    view.activate(answer, "think:")
    assert "Two plus two is four." in view.delegate.document(answer)[0].toPlainText()
    menu = view.show_actions(view.chat_model.index(1, 0), view.mapToGlobal(QPoint(5, 5)))
    toggle = [a for a in menu.actions() if a.text() == "Show or hide the thinking"]  # keyboard users: the menu
    assert len(toggle) == 1
    toggle[0].trigger()
    menu.close()
    assert "Two plus two" not in view.delegate.document(answer)[0].toPlainText()
    view.activate(answer, "copymsg:")
    assert QGuiApplication.clipboard().text() == "**4**"


def test_a_thought_cut_short_says_what_helps(parley):
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "prove it")
    answer = store.add_message(conv, user.id, "assistant", f"<think>\n{THOUGHT}")
    store.update_message(answer.id, stats={"reason": "length"})
    w.open_chat(conv)
    text = w.chat.view.delegate.document(store.message(answer.id))[0].toPlainText()
    assert "Cut short while thinking: max tokens reached" in text and "turn Thinking off" in text
