"""PrefixCache: a new turn starts from the longest prefix that any cache slot of its model holds.

Slots are the unit: a live session's slot keeps its conversation between turns, and a closed session's slot is
parked here (its tokens remembered) instead of freed, until a sequence needs the slot (least recently used
first) or the parked budget is full. A match is copied into the turn's own slot (`seq_clone` + `rewind`), so
sharing never aliases storage that another sequence may later overwrite. Sliding-window layers are exact: a
prefix of length P from a slot is usable only if that slot's rings still hold what position P needs
(`CacheBook.floor`), else that slot offers nothing.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from engine.cache import KVCache
from engine.session import common_prefix


@dataclass(frozen=True, slots=True)
class Match:
    slot: int
    length: int  # tokens of the slot's cache that the new turn can keep


class PrefixCache:
    """The parked slots of one model's cache, and the lookup over parked and live slots."""

    def __init__(self, cache: KVCache, max_parked: int, max_tokens: int):
        self.cache = cache
        # the budget: at most this many closed conversations, of at most this many tokens in all, stay cached
        self.max_parked, self.max_tokens = max_parked, max_tokens
        self._parked: OrderedDict[int, list[int]] = OrderedDict()  # slot -> tokens, least recently used first

    # -- parked slots
    def park(self, slot: int, tokens: list[int]) -> bool:
        """Keeps a closed sequence's slot and its tokens; False (nothing kept) when the budget is zero."""
        if self.max_parked < 1 or not tokens or len(tokens) > self.max_tokens:
            return False
        while len(self._parked) >= self.max_parked or self.parked_tokens() + len(tokens) > self.max_tokens:
            self.evict()
        self._parked[slot] = list(tokens)
        return True

    def evict(self, skip: int | None = None) -> int | None:
        """Frees the least recently used parked slot (not `skip`); its number, or None when there is none."""
        slot = next((s for s in self._parked if s != skip), None)
        if slot is None:
            return None
        del self._parked[slot]
        self.cache.seq_rm(slot)
        return slot

    def clear(self) -> None:
        while self._parked:
            self.evict()

    @property
    def parked(self) -> int:
        return len(self._parked)

    def parked_tokens(self) -> int:
        return sum(len(t) for t in self._parked.values())

    # -- lookup
    def best(self, ids: list[int], live: list[tuple[int, list[int]]], exclude: int | None = None) -> Match | None:
        """The longest usable prefix of `ids` over the parked slots and `live` (slot, cached tokens), leaving at
        least the last token of `ids` to compute; ties prefer a live slot. None when nothing matches."""
        best: Match | None = None
        limit = len(ids) - 1  # the last prompt token must run: its logits sample the answer
        for slot, tokens in [*live, *self._parked.items()]:
            if slot == exclude:
                continue
            n = min(common_prefix(ids, tokens), limit)
            if n > 0 and n >= self.cache.book.floor(slot) and (best is None or n > best.length):
                best = Match(slot, n)
        if best is not None and best.slot in self._parked:
            self._parked.move_to_end(best.slot)  # recently used
        return best

    def holds(self, slot: int) -> bool:
        return slot in self._parked

    def take(self, match: Match) -> int:
        """The matched parked slot itself, cut to the match: where no slot is free to copy into, the parked prefix
        becomes the turn's own (it leaves the cache, as it would to make room for the turn)."""
        del self._parked[match.slot]
        self.cache.rewind(match.slot, match.length)
        return match.slot

    def adopt(self, match: Match) -> int:
        """A new slot holding the first `match.length` tokens of the matched slot (a copy on the device)."""
        slot = self.cache.seq_clone(match.slot)
        self.cache.rewind(slot, match.length)
        return slot

