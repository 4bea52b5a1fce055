"""Sequence: one generation's tokens and cache slot, flowing scheduler -> runner -> sampler."""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from engine.sampling import SamplerState


class Status(Enum):
    WAITING = "waiting"  # not yet holding a cache slot
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Sequence:
    seq_id: int
    token_ids: list[int]  # everything the cache should hold: history, prompt, generated so far
    sampler: SamplerState
    stop_ids: frozenset[int] = frozenset()
    max_len: int = 1 << 30  # the cache's context limit for this sequence
    slot: int | None = None
    num_cached: int = 0  # tokens already in the cache
    num_prompt: int = 0  # tokens that were there before this turn's generation
    num_reused: int = 0  # cached tokens this turn started from (its own, or copied from another slot)
    status: Status = Status.WAITING
    group: int | None = None  # the turns one client sent together (a server request): admitted in turn with others'
    finish_reason: str | None = None
    generated: list[int] = field(default_factory=list)
    draft: list[int] = field(default_factory=list)  # tokens proposed to follow token_ids, verified by the next step
    draft_state: Any = None  # the drafter's own per-sequence state (engine/speculative)
    num_steps: int = 0  # this turn's decode steps: generated / num_steps is the tokens one step yields
    num_drafted: int = 0  # this turn's drafted tokens, and the accepted ones that are in its answer
    num_accepted: int = 0
    from_draft: bytearray = field(default_factory=bytearray)  # per generated token: 1 where it was an accepted draft
    # the log-probabilities of the tokens the last step appended (engine/logprobs.py), where its params ask for them
    step_logprobs: list = field(default_factory=list)
    # entry i: prompt token i + 1's log-probability (engine/prompt_logprobs.py), where the params ask; filled by prefill
    prompt_logprobs: list = field(default_factory=list)
    guide: Any = None  # this turn's grammar as it goes (engine/constraint/guide.py), where its params set one
    # token_ids as int64, kept in step with the list: penalties read the whole history every step (engine/sampling.py)
    token_array: array = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.num_prompt = len(self.token_ids)
        self.token_array = array("q", self.token_ids)

    @property
    def num_uncached(self) -> int:
        return len(self.token_ids) - self.num_cached

    @property
    def scores_prompt(self) -> bool:
        """Its params ask for the prompt's log-probabilities: every prompt position must run (no cached prefix)."""
        return self.sampler.params.prompt_logprobs is not None

    def new_turn(self, ids: list[int]) -> None:
        """The next turn's tokens; its counters start again."""
        self.token_ids, self.num_prompt, self.generated, self.finish_reason = list(ids), len(ids), [], None
        self.token_array = array("q", self.token_ids)
        self.draft, self.num_steps, self.num_drafted, self.num_accepted, self.from_draft = [], 0, 0, 0, bytearray()
        self.guide, self.prompt_logprobs = None, []

    def append(self, token: int, draft: bool = False) -> None:
        """`draft`: an accepted draft (engine/speculative), counted in num_accepted while it stays in the answer."""
        self.token_ids.append(token)
        self.token_array.append(token)
        self.generated.append(token)
        self.from_draft.append(draft)
        self.num_accepted += draft

    def history(self) -> array:
        """token_ids as int64: what the penalties read every step (copying an array's bytes, not unboxing ints)."""
        ids, arr = self.token_ids, self.token_array
        if len(arr) != len(ids) or (ids and arr[-1] != ids[-1]):  # the list was changed around append / drop_last
            self.token_array = arr = array("q", ids)
        return arr

    def penalty_history(self) -> array:
        """What the penalties read: the history, or only this turn's answer where the params keep the prompt out."""
        history = self.history()
        return history if self.sampler.params.penalize_prompt else history[self.num_prompt:]

    def drop_last(self, n: int) -> None:
        """Takes back the last n generated tokens."""
        self.num_accepted -= sum(self.from_draft[-n:])
        del self.token_ids[-n:], self.token_array[-n:], self.generated[-n:], self.from_draft[-n:]
