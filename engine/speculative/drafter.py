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


@dataclass(slots=True)
class Pacing:
    """One sequence's draft length and back-off."""

    config: PacingConfig
    length: int = 0
    skip: int = 0  # decode steps left without drafting
    misses: int = 0  # drafts in a row of which nothing was kept

    def __post_init__(self) -> None:
        self.length = self.config.first

    def ready(self) -> bool:
        return self.skip == 0

    def wait(self) -> None:
        """A decode step passed without a draft."""
        self.skip = max(0, self.skip - 1)

    def observe(self, drafted: int, accepted: int) -> None:
        if accepted == drafted:
            self.length, self.misses = min(self.config.most, self.length + 2), 0
        elif accepted:
            self.length, self.misses = max(1, accepted + 1), 0
        else:
            self.misses += 1
            self.length = max(1, self.length // 2)
            self.skip = min(self.config.max_backoff, 2 ** self.misses - 1)
