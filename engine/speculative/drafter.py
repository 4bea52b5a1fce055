"""What the batcher asks of a drafter, and the per-sequence pacing every drafter shares.

Pacing: how many tokens to draft adapts to what the model accepted. A fully accepted draft lengthens the next
one; a partly accepted one shortens it to what was kept plus one; a draft of which nothing was kept backs off
for a number of steps that grows with each miss in a row, so text where nothing matches costs almost nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.sequence import Sequence


class Drafter(Protocol):
    name: str
    max_sequences: int  # no drafts while more sequences than this decode in one step (PacingConfig.most_sequences)

    def may_draft(self, seq: Sequence) -> bool:
        """Cheap: whether `propose` might return tokens for this sequence at its next decode step."""

    def propose(self, seqs: list[Sequence], room: list[int]) -> None:
        """Sets `seq.draft` (at most room[i] tokens, possibly none) for each sequence about to decode."""

    def observe(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """After a verify step: `accepted` of the sequence's `drafted` tokens were kept."""


@dataclass(slots=True)
class PacingConfig:
    first: int = 4  # tokens drafted after a match with no history yet
    most: int = 8  # draft length at most
    max_backoff: int = 32  # steps skipped at most after misses in a row
    # Drafting pays while few sequences decode on the CPU: a batch already shares each weight read among its
    # sequences, and verify rows cost more than they save (bench/speculative.py, 8 sessions: 0.82x). CUDA runners
    # with decode graphs lift this (make_drafter's verify_rows).
    most_sequences: int = 2


@dataclass(slots=True)
class Pacing:
    """One sequence's draft length and back-off, counted in the sequence's decode steps (`Sequence.num_steps`)."""

    config: PacingConfig
    length: int = 0
    skip: int = 0  # decode steps without drafting after the last draft (0 unless it was a miss)
    misses: int = 0  # drafts in a row of which nothing was kept
    resume_at: int = 0  # the decode step from which the sequence drafts again

    def __post_init__(self) -> None:
        self.length = self.config.first

    def due(self, step: int) -> bool:
        return step >= self.resume_at

    def observe(self, drafted: int, accepted: int, step: int = 0) -> None:
        """After a verify step at decode step `step`: `accepted` of `drafted` tokens were kept."""
        if accepted == drafted:
            self.length, self.misses, self.skip = min(self.config.most, self.length + 2), 0, 0
        elif accepted:
            self.length, self.misses, self.skip = max(1, accepted + 1), 0, 0
        else:
            self.misses += 1
            self.length = max(1, self.length // 2)
            self.skip = min(self.config.max_backoff, 2 ** self.misses - 1)
        self.resume_at = step + self.skip


class Paced:
    """`may_draft` and `observe` for drafters whose per-sequence state (`Sequence.draft_state`) has a `pacing`."""

    def may_draft(self, seq: Sequence) -> bool:
        pacing = getattr(seq.draft_state, "pacing", None)
        return pacing is None or pacing.due(seq.num_steps)

    def observe(self, seq: Sequence, drafted: int, accepted: int) -> None:
        pacing = getattr(seq.draft_state, "pacing", None)
        if pacing is not None:
            pacing.observe(drafted, accepted, seq.num_steps)
