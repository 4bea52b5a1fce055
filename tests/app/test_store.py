"""ConversationStore and ChatSettings without Qt: the message tree, versions, branches, search."""
from __future__ import annotations

import pytest

from app.core.chat_settings import ChatSettings
from app.core.conversations import ConversationStore
from app.core.live import engine_messages, engine_view
from engine.errors import ParleyError


def _chat(store: ConversationStore):
    conv = store.create()
    u1 = store.add_message(conv.id, None, "user", "hi")
    a1 = store.add_message(conv.id, u1.id, "assistant", "hello")
    u2 = store.add_message(conv.id, a1.id, "user", "more")
    a2 = store.add_message(conv.id, u2.id, "assistant", "sure")
    return conv, u1, a1, u2, a2


def test_path_versions_and_select():
    store = ConversationStore()
    conv, u1, a1, u2, a2 = _chat(store)
    assert store.path(conv.id) == [u1, a1, u2, a2]
    a1b = store.add_message(conv.id, u1.id, "assistant", "hey")  # regenerate
    assert store.path(conv.id) == [u1, a1b] and store.versions(a1b) == [a1, a1b]
    store.select(a1.id)  # back to version 1 follows its newest descendants
    assert store.path(conv.id) == [u1, a1, u2, a2]
    u1b = store.add_message(conv.id, None, "user", "hi, edited")  # edit of a root message
    assert store.versions(u1b) == [u1, u1b] and store.path(conv.id) == [u1b]
    store.select(u1.id)
    assert store.path(conv.id)[-1] is a1b  # newest child of u1


def test_search_rename_pin_delete():
    store = ConversationStore()
    conv, *_ = _chat(store)
    other = store.create("Shopping list")
    store.update(other.id, pinned=True)
    assert store.conversations()[0] is other
    assert store.search("SURE") == [conv] and store.search("shop") == [other]
    hidden = store.create("column", hidden=True)
    assert hidden not in store.conversations() and hidden in store.conversations(include_hidden=True)
    store.delete(conv.id)
    assert store.search("sure") == [] and not store.has(conv.id)


def test_engine_view_drops_what_the_engine_drops():
    store = ConversationStore()
    conv, u1, a1, u2, a2 = _chat(store)
    store.update_message(a2.id, state="error")
    assert engine_view(store.path(conv.id)) == [u1, a1, u2]
    store.update_message(a2.id, state="stopped", content="")
    assert engine_view(store.path(conv.id)) == [u1, a1, u2]
    store.update_message(a2.id, state="stopped", content="par")
    assert engine_view(store.path(conv.id)) == [u1, a1, u2, a2]


def test_earlier_answers_reach_the_engine_without_their_thought():
    store = ConversationStore()
    conv, u1, a1, u2, a2 = _chat(store)
    store.update_message(a1.id, content="<think>\nsums\n</think>\n\n4")
    store.update_message(a2.id, content="[THINK]more sums[/THINK]5, then", state="stopped")
    path = store.path(conv.id)
    assert [m["content"] for m in engine_messages(path)] == [u1.content, "4", u2.content, "5, then"]
    continued = engine_messages(path, continuing=True)  # the answer being continued keeps its text
    assert [m["content"] for m in continued] == [u1.content, "4", u2.content, "[THINK]more sums[/THINK]5, then"]
    assert [m["role"] for m in continued] == ["user", "assistant", "user", "assistant"]


def test_chat_settings_validate_and_round_trip():
    s = ChatSettings(temperature=0.3, seed=5, max_tokens=9, thinking=False)
    assert ChatSettings.from_dict({**s.to_dict(), "unknown": 1}) == s
    assert s.sampling().seed == 5 and s.sampling().max_tokens == 9 and s.sampling().thinking is False
    assert ChatSettings.from_dict({"temperature": 0.3}).thinking is None  # chats saved before the switch
    with pytest.raises(ParleyError):
        ChatSettings(top_p=0)
    with pytest.raises(ValueError):
        ChatSettings(overflow="wrap")
