"""Prompt lookup: no model. The draft is what followed the latest earlier occurrence of the sequence's last n tokens
(n from `longest` down to `shortest`), in its own tokens (prompt and answer so far) or in a pool of other token
lists of the same model: the other live chats (compare columns answering one prompt), and earlier turns (a
regenerated answer drafts from the one it replaces). Input-grounded work (rewriting a given file, summarising a
given text, quoting) repeats long runs of the prompt, which is where this pays.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from engine.sequence import Sequence
from engine.speculative.drafter import Paced, Pacing, PacingConfig


@dataclass(slots=True)
class LookupConfig:
    longest: int = 4  # n-gram lengths matched, longest first
    shortest: int = 2
    # n-gram length at least while more than 2 sequences are due a lookup in one step (None: `shortest`): there a
    # 2-gram's guesses cost every session's verify rows (CPU on AMX tiles, 8 sessions of open chat: 0.966x of off
    # with 2-grams, 1.009x with 3; code_edit 1.47x / 1.37x)
    shortest_shared: int | None = None
    pool_tokens: int = 1 << 16  # token lists kept for lookup across sequences, least recently used dropped first
    pacing: PacingConfig = field(default_factory=PacingConfig)
    max_idle: int = 4  # decode steps at most between lookups that find nothing

    def __post_init__(self) -> None:
        if not 1 <= self.shortest <= self.longest:
            raise ValueError("n-gram lengths must satisfy 1 <= shortest <= longest")
        if self.shortest_shared is not None and not self.shortest <= self.shortest_shared <= self.longest:
            raise ValueError("n-gram lengths must satisfy shortest <= shortest_shared <= longest")


class NgramIndex:
    """n-gram -> end of its latest occurrence in one token list, brought up to date as the list grows; with a pool
    (`NgramPool`), each n-gram indexed is also the pool's latest occurrence."""

    __slots__ = ("tokens", "done", "maps", "pool", "serial")

    def __init__(self, tokens: list[int], shortest: int, longest: int, pool: NgramPool | None = None):
        self.tokens = tokens
        self.done = 0  # n-grams ending at positions up to here (exclusive ends) are indexed
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(shortest, longest + 1)}
        self.pool, self.serial = pool, (pool.join(self) if pool is not None else 0)

    def update(self, end: int) -> None:
        """Indexes every n-gram ending at or before `end` (an exclusive end)."""
        t = self.tokens
        if self.done > len(t):  # the list was cut back (a stop string): start again
            self.forget()
        shared = self.pool.maps if self.pool is not None else None
        for e in range(self.done + 1, end + 1):
            for n, m in self.maps.items():
                if e >= n:
                    key = tuple(t[e - n : e])
                    m[key] = e
                    if shared is not None:
                        shared[n][key] = (self.serial << 32) | e
        self.done = max(self.done, end)

    def forget(self) -> None:
        """Unindexes everything, in the pool too where the pool's latest occurrence is this list's."""
        if self.pool is not None:
            self.pool.drop(self)
        self.done = 0
        for m in self.maps.values():
            m.clear()

    def continuation(self, key: tuple[int, ...], limit: int) -> list[int]:
        end = self.maps[len(key)].get(key)
        return [] if end is None else self.tokens[end : end + limit]


class NgramPool:
    """The token lists other sequences draft from (live chats' and earlier turns'), least recently used dropped past
    `budget` tokens, and one map of their n-grams to the latest occurrence among them: a lookup asks it once, where
    asking every list cost 0.14 ms a lookup with 160 earlier answers pooled, 0.017 ms so (bench/lookup_host.py)."""

    def __init__(self, shortest: int, longest: int, budget: int):
        self.budget = budget
        self.lists: OrderedDict[int, NgramIndex] = OrderedDict()  # serial -> index, most recently used last
        # n -> n-gram -> (serial << 32) | end: an int, not a tuple, as the map holds up to three entries a token
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(shortest, longest + 1)}
        self._serials = 0

    def join(self, index: NgramIndex) -> int:
        self._serials += 1
        self.lists[self._serials] = index
        self._trim()
        return self._serials

    def touch(self, index: NgramIndex) -> None:
        """`index` is in use: the most recent, back in if the pool had dropped it."""
        if index.serial not in self.lists:
            self.lists[index.serial] = index
            for n, m in index.maps.items():  # its n-grams went with it
                for key, end in m.items():
                    self.maps[n].setdefault(key, (index.serial << 32) | end)
            self._trim()
        self.lists.move_to_end(index.serial)

    def refresh(self) -> None:
        """Every list indexed up to, not including, its final n-gram: nothing follows that, and as the latest
        occurrence it would hide the earlier one its own sequence drafts from."""
        for index in self.lists.values():
            if index.done < len(index.tokens) - 1 or index.done > len(index.tokens):
                index.update(len(index.tokens) - 1)

    def continuation(self, key: tuple[int, ...], limit: int) -> list[int]:
        found = self.maps[len(key)].get(key)
        index = None if found is None else self.lists.get(found >> 32)
        end = 0 if found is None else found & 0xFFFFFFFF
        return [] if index is None else index.tokens[end : end + limit]

    def drop(self, index: NgramIndex) -> None:
        """`index`'s n-grams out of the map where they are the latest occurrence (its own map holds its latest)."""
        for n, m in index.maps.items():
            shared = self.maps[n]
            for key, end in m.items():
                if shared.get(key) == (index.serial << 32) | end:
                    del shared[key]

    def _trim(self) -> None:
        """The least recently used lists out past the budget; never the one just added (it is last)."""
        total = sum(len(index.tokens) for index in self.lists.values())
        while total > self.budget and len(self.lists) > 1:
            serial, index = next(iter(self.lists.items()))
            del self.lists[serial]
            self.drop(index)
            total -= len(index.tokens)


@dataclass(slots=True)
class _State:
    index: NgramIndex
    pacing: Pacing
    empty: int = 0  # lookups in a row that found nothing


class PromptLookup(Paced):
    name = "lookup"

    def __init__(self, config: LookupConfig | None = None):
        self.config = config or LookupConfig()
        self.pacing = self.config.pacing  # as every drafter names it: the runtime reserves cache rows for `most`
        self.max_sequences = self.pacing.most_sequences
        self._pool = NgramPool(self.config.shortest, self.config.longest, self.config.pool_tokens)

    def propose(self, seqs: list[Sequence], room: list[int]) -> None:
        c = self.config
        shortest = c.shortest if len(seqs) <= 2 or c.shortest_shared is None else max(c.shortest, c.shortest_shared)
        for seq, most in zip(seqs, room):
            state = self._state(seq)
            if most <= 0 or not state.pacing.due(seq.num_steps):
                continue
            seq.draft = self._find(seq, state.index, min(state.pacing.length, most), shortest)
            state.empty = 0 if seq.draft else state.empty + 1
            if not seq.draft:  # look again a few steps on: meanwhile decode steps may run ahead (CUDA graphs)
                state.pacing.resume_at = seq.num_steps + min(state.empty, self.config.max_idle)

    def _state(self, seq: Sequence) -> _State:
        """The sequence's index over its current token list; a new turn (a new list) starts a new one, and the
        old one stays in the pool for other turns to draft from."""
        state = seq.draft_state
        if isinstance(state, _State) and state.index.tokens is seq.token_ids:
            return state
        c = self.config
        seq.draft_state = state = _State(NgramIndex(seq.token_ids, c.shortest, c.longest, self._pool), Pacing(c.pacing))
        return state

    def _find(self, seq: Sequence, own: NgramIndex, k: int, shortest: int) -> list[int]:
        tokens, c = seq.token_ids, self.config
        end = len(tokens)
        self._pool.touch(own)
        self._pool.refresh()
        for n in range(min(c.longest, end), shortest - 1, -1):
            key = tuple(tokens[end - n :])
            draft = own.continuation(key, k) or self._pool.continuation(key, k)
            if draft:
                return draft
        return []
