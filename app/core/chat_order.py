"""ChatOrder: the chats in the sidebar's order (pinned first, then the most recently active), kept as they change. Each
refresh sorted every chat with a Python key instead: 2.6-3.7 ms at 20,000 chats, a change now moves one chat."""
from __future__ import annotations

import heapq
from bisect import bisect_left
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # the store holds an order: conversations.py imports this file
    from app.core.conversations import Conversation

Rank = tuple[bool, bool, float, int]  # (hidden, not pinned, -updated_at, -id): listed chats first; unique (the id)
ORDER_FIELDS = frozenset({"hidden", "pinned", "updated_at"})  # a change to one of these moves the chat


def rank(conv: Conversation) -> Rank:
    return (conv.hidden, not conv.pinned, -conv.updated_at, -conv.id)


class ChatOrder:
    """Two parallel lists sorted by rank (the chats and their ranks as placed); a chat whose order fields change is
    placed again by whoever changed them (the store)."""

    def __init__(self) -> None:
        self._ranks: list[Rank] = []
        self._convs: list[Conversation] = []
        self._rank_of: dict[int, Rank] = {}

    def reset(self, convs: Iterable[Conversation]) -> None:
        """All of `convs`, sorted once (a store read from its file)."""
        self._convs = sorted(convs, key=rank)
        self._ranks = list(map(rank, self._convs))
        self._rank_of = {c.id: r for c, r in zip(self._convs, self._ranks)}

    def place(self, conv: Conversation) -> None:
        """`conv` where its rank puts it now (new, or moved)."""
        self.remove(conv.id)
        new = rank(conv)
        i = bisect_left(self._ranks, new)
        self._ranks.insert(i, new)
        self._convs.insert(i, conv)
        self._rank_of[conv.id] = new

    def remove(self, conv_id: int) -> None:
        old = self._rank_of.pop(conv_id, None)
        if old is None:
            return
        i = bisect_left(self._ranks, old)
        if i == len(self._convs) or self._convs[i].id != conv_id:  # a NaN time (a hand-edited file) compares false
            i = next(k for k, c in enumerate(self._convs) if c.id == conv_id)
        del self._ranks[i], self._convs[i]

    def listed(self, include_hidden: bool = False) -> list[Conversation]:
        """The chats in order; hidden ones (compare columns) only with `include_hidden`, among the others by rank."""
        shown = bisect_left(self._ranks, (True,))  # the hidden chats' ranks all begin with True
        if not include_hidden or shown == len(self._convs):
            return self._convs[:shown]
        return list(heapq.merge(self._convs[:shown], self._convs[shown:], key=lambda c: self._rank_of[c.id][1:]))
