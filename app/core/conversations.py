"""ConversationStore: conversations and their message trees, kept in memory for now.

The shapes map onto tables for the SQLite store that replaces this one:
conversation(id, title, pinned, hidden, created_at, updated_at, leaf_id, settings_json) and
message(id, conversation_id, parent_id, role, content, state, error, stats_json, model, created_at).
A branch is the path from a root message to a leaf; versions of a message are its siblings of the same role.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from app.core.chat_order import ORDER_FIELDS, ChatOrder
from app.core.chat_settings import ChatSettings

STALE_CHECK_MESSAGES = 500  # a scan given up asks whether it still matters this often (~1 ms of messages)
STATES = ("done", "waiting", "queued", "streaming", "stopped", "error", "interrupted")  # interrupted: cut off by a crash


class SearchStopped(Exception):
    """A search nobody waits for any more (the text looked for was typed over)."""


def scan_messages(messages: list[tuple[int, str]], text: str, stale: Callable[[], bool] = lambda: False) -> set[int]:
    """The chats of (chat, message text) pairs whose text holds `text`, case-insensitive; SearchStopped once
    `stale()` says nobody waits for them."""
    needle, hits = text.strip().casefold(), set()
    for i, (conv_id, content) in enumerate(messages):
        if i % STALE_CHECK_MESSAGES == 0 and stale():
            raise SearchStopped(text)
        if conv_id not in hits and needle in content.casefold():
            hits.add(conv_id)
    return hits


@dataclass(eq=False, slots=True)
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str  # "user" or "assistant"
    content: str = ""
    state: str = "done"  # one of STATES
    error: str = ""
    stats: dict | None = None
    model: str = ""
    created_at: float = field(default_factory=time.time)


def failed_unanswered(msg: Message) -> bool:
    """An answer that failed before a word of it came: Retry replaces it (it holds nothing but the error)."""
    return msg.role == "assistant" and msg.state == "error" and not msg.content


@dataclass(eq=False, slots=True)
class Conversation:
    """Changed through its store (update), which keeps the chats in order: pinned, hidden and updated_at set on the
    object itself leave it where it was."""

    id: int
    title: str
    settings: ChatSettings
    pinned: bool = False
    hidden: bool = False  # a compare column, not listed in the sidebar until promoted
    leaf_id: int | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)


class ConversationStore:
    """In-memory store; every method is cheap and none of them knows about Qt or the engine."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._conversations: dict[int, Conversation] = {}
        self._messages: dict[int, Message] = {}
        self._children: dict[tuple[int, int | None], list[int]] = {}  # (conversation, parent) -> ids, oldest first
        self._compare: dict[int, list[int]] = {}  # compare group -> its columns' conversations, in order
        self._order = ChatOrder()

    # -- conversations
    def create(self, title: str = "New chat", settings: ChatSettings | None = None, hidden: bool = False) -> Conversation:
        conv = Conversation(next(self._ids), title, settings or ChatSettings(), hidden=hidden)
        self._conversations[conv.id] = conv
        self._order.place(conv)
        return conv

    def get(self, conv_id: int) -> Conversation:
        return self._conversations[conv_id]

    def has(self, conv_id: int) -> bool:
        return conv_id in self._conversations

    def conversations(self, include_hidden: bool = False) -> list[Conversation]:
        """Pinned first, then the most recently active."""
        return self._order.listed(include_hidden)

    def update(self, conv_id: int, **changes) -> Conversation:
        conv = self._conversations[conv_id]
        for name, value in changes.items():
            setattr(conv, name, value)
        if not ORDER_FIELDS.isdisjoint(changes):
            self._order.place(conv)
        return conv

    def _reorder(self) -> None:
        """The order made again from all the chats (once they are read in, not created one by one)."""
        self._order.reset(self._conversations.values())

    def delete(self, conv_id: int) -> None:
        for members in self._compare.values():
            if conv_id in members:
                members.remove(conv_id)
        self._conversations.pop(conv_id)
        self._order.remove(conv_id)
        self._delete_under(conv_id, None)

    def _delete_under(self, conv_id: int, parent_id: int | None) -> list[int]:
        """Deletes the messages under `parent_id` (the chat's whole tree for None), walked down from it rather than
        every message looked at; their ids, each before those under it."""
        gone, parents = [], [parent_id]
        while parents:
            for mid in self._children.pop((conv_id, parents.pop()), ()):
                del self._messages[mid]
                gone.append(mid)
                parents.append(mid)
        return gone

    def search(self, text: str) -> list[Conversation]:
        """Conversations whose title or any message contains `text` (case-insensitive)."""
        needle = text.strip().casefold()
        if not needle:
            return self.conversations()
        hits = {m.conversation_id for m in self._messages.values() if needle in m.content.casefold()}
        return [c for c in self.conversations() if c.id in hits or needle in c.title.casefold()]

    def message_search(self, text: str) -> Callable[[Callable[[], bool]], set[int]] | None:
        """search(text)'s message part for another thread to run (scan_messages; its argument: whether the answer is no
        longer wanted), on the messages' text as it is now: the strings never change, only the dict holding them."""
        return partial(scan_messages, [(m.conversation_id, m.content) for m in self._messages.values()], text)

    def search_with(self, text: str, hits: set[int]) -> list[Conversation]:
        """search(text) given `hits`, the chats whose messages hold it (as message_search found them); titles looked at
        here, against the chats as they are now."""
        needle = text.strip().casefold()
        if not needle:
            return self.conversations()
        return [c for c in self.conversations() if c.id in hits or needle in c.title.casefold()]

    # -- messages
    def add_message(self, conv_id: int, parent_id: int | None, role: str, content: str = "", state: str = "done") -> Message:
        """Appends a child of `parent_id` and makes it the conversation's leaf (the branch shown)."""
        msg = Message(next(self._ids), conv_id, parent_id, role, content, state)
        self._messages[msg.id] = msg
        self._children.setdefault((conv_id, parent_id), []).append(msg.id)
        conv = self._conversations[conv_id]
        conv.leaf_id, conv.updated_at = msg.id, time.time()
        self._order.place(conv)
        return msg

    def has_message(self, msg_id: int) -> bool:
        return msg_id in self._messages

    def message(self, msg_id: int) -> Message:
        return self._messages[msg_id]

    def delete_message(self, msg_id: int) -> list[int]:
        """Deletes a message and every message under it (its answer, their versions); a branch shown through them ends
        at its parent. The ids deleted, each after those under it (the order a file without cascades deletes in)."""
        msg = self._messages.pop(msg_id)
        siblings = self._children[(msg.conversation_id, msg.parent_id)]
        siblings.remove(msg_id)
        if not siblings:
            del self._children[(msg.conversation_id, msg.parent_id)]
        gone = [msg_id, *self._delete_under(msg.conversation_id, msg_id)]
        conv = self._conversations[msg.conversation_id]
        if conv.leaf_id in gone:
            conv.leaf_id = msg.parent_id
        return gone[::-1]

    def update_message(self, msg_id: int, **changes) -> Message:
        msg = self._messages[msg_id]
        for name, value in changes.items():
            setattr(msg, name, value)
        return msg

    def append_text(self, msg_id: int, text: str) -> Message:
        msg = self._messages[msg_id]
        msg.content += text
        return msg

    def children(self, conv_id: int, parent_id: int | None) -> list[Message]:
        """The messages under `parent_id`, oldest first."""
        return [self._messages[i] for i in self._children.get((conv_id, parent_id), [])]

    def path(self, conv_id: int) -> list[Message]:
        """The branch shown: root -> leaf."""
        out = []
        mid = self._conversations[conv_id].leaf_id
        while mid is not None:
            msg = self._messages[mid]
            out.append(msg)
            mid = msg.parent_id
        out.reverse()
        return out

    def versions(self, msg: Message) -> list[Message]:
        """The message and its alternatives (regenerated answers, edited prompts), oldest first."""
        return [m for m in self.children(msg.conversation_id, msg.parent_id) if m.role == msg.role]

    def select(self, msg_id: int) -> None:
        """Shows the branch through `msg_id`, following the newest child below it."""
        msg = self._messages[msg_id]
        while True:
            kids = self.children(msg.conversation_id, msg.id)
            if not kids:
                break
            msg = kids[-1]
        self._conversations[msg.conversation_id].leaf_id = msg.id

    def set_leaf(self, conv_id: int, msg_id: int | None) -> None:
        self._conversations[conv_id].leaf_id = msg_id

    # -- compare groups: the columns of one side-by-side comparison, in order
    def add_compare_group(self, conv_ids: list[int], title: str = "") -> int:
        gid = next(self._ids)
        self._compare[gid] = list(conv_ids)
        return gid

    def compare_groups(self) -> dict[int, list[int]]:
        return {g: list(m) for g, m in self._compare.items() if m}

    def set_compare_members(self, group_id: int, conv_ids: list[int]) -> None:
        self._compare[group_id] = list(conv_ids)

    def delete_compare_group(self, group_id: int) -> None:
        self._compare.pop(group_id, None)
