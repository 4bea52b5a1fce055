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
    """n-gram -> end of its latest occurrence in one token list, brought up to date as the list grows."""

    __slots__ = ("tokens", "done", "maps")

    def __init__(self, tokens: list[int], shortest: int, longest: int):
        self.tokens = tokens
        self.done = 0  # n-grams ending at positions up to here (exclusive ends) are indexed
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(shortest, longest + 1)}

    def update(self, end: int) -> None:
        """Indexes every n-gram ending at or before `end` (an exclusive end)."""
        t = self.tokens
        if self.done > len(t):  # the list was cut back (a stop string): start again
            self.done = 0
            for m in self.maps.values():
                m.clear()
        for e in range(self.done + 1, end + 1):
            for n, m in self.maps.items():
                if e >= n:
                    m[tuple(t[e - n : e])] = e
        self.done = max(self.done, end)

    def continuation(self, key: tuple[int, ...], limit: int) -> list[int]:
        end = self.maps[len(key)].get(key)
        return [] if end is None else self.tokens[end : end + limit]


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
        self._pool: OrderedDict[int, NgramIndex] = OrderedDict()  # id(index) -> index, most recently used last

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
        index = NgramIndex(seq.token_ids, c.shortest, c.longest)
        seq.draft_state = state = _State(index, Pacing(c.pacing))
        self._pool[id(index)] = index
        self._trim_pool()
        return state

    def _find(self, seq: Sequence, own: NgramIndex, k: int, shortest: int) -> list[int]:
        tokens, c = seq.token_ids, self.config
        end = len(tokens)
        self._pool[id(own)] = own  # back in, most recent, if the pool had dropped it
        self._pool.move_to_end(id(own))
        others = [index for index in reversed(self._pool.values()) if index is not own]
        # never a list's final n-gram: nothing follows it, and as its latest occurrence it would hide the earlier
        # one its own sequence drafts from (another sequence's lookup in the same step brings the index up to date)
        for index in (own, *others):
            index.update(len(index.tokens) - 1)
        for n in range(min(c.longest, end), shortest - 1, -1):
            key = tuple(tokens[end - n :])
            for index in (own, *others):
                draft = index.continuation(key, k)
                if draft:
                    return draft
        return []

    def _trim_pool(self) -> None:
        total = sum(len(index.tokens) for index in self._pool.values())
        while total > self.config.pool_tokens and len(self._pool) > 1:
            _, index = self._pool.popitem(last=False)
            total -= len(index.tokens)
