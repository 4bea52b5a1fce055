"""build_step: one pass over the scheduled sequences lays out the flat token axis of one forward."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.cache import KVCache, Segment
from engine.sequence import Sequence


@dataclass(slots=True)
class StepBatch:
    tokens: torch.Tensor  # (T,) host int64; entry i of tokens/positions names the same token
    positions: torch.Tensor  # (T,) host int64
    segments: list[Segment]
    logit_rows: torch.Tensor  # (R,) host int64: rows whose logits are sampled, each sampler's last token (and drafts)
    scheduled: list[tuple[Sequence, int]]
    samplers: list[Sequence]  # the sequences that sample this step, in logit_rows order
    device_tokens: torch.Tensor | None = None  # a look-ahead step: its tokens are the last step's ids, on the device

    @property
    def verifies(self) -> bool:
        """Some sequence brings drafted tokens: more sampled rows than samplers."""
        return len(self.logit_rows) > len(self.samplers)


def build_step(scheduled: list[tuple[Sequence, int]], cache: KVCache) -> StepBatch:
    """Declares the step to the cache and emits tokens, positions and the rows to sample, on the host.

    The runner moves them: a replayed decode graph takes them in one pinned copy, an eager step as is.
    """
    rowwise = frozenset(seq.slot for seq, _ in scheduled if seq.draft)  # verified drafts compute as decode rows
    segments = cache.declare_step([(seq.slot, n) for seq, n in scheduled], rowwise)
    tokens: list[int] = []
    positions: list[int] = []
    rows: list[int] = []
    samplers: list[Sequence] = []
    for (seq, n), seg in zip(scheduled, segments):
        positions += range(seg.start, seg.start + n)
        if seq.draft:  # a verify: the last token, then the drafts, every row sampled (engine/speculative/verify.py)
            assert n == len(seq.draft) + 1 and seq.num_uncached == 1, "a draft follows a sequence's last token"
            tokens += [seq.token_ids[-1], *seq.draft]
            rows += range(seg.q_start, seg.q_start + n)
            samplers.append(seq)
            continue
        tokens += seq.token_ids[seq.num_cached : seq.num_cached + n]
        if seq.num_cached + n == len(seq.token_ids):  # this chunk reaches the end: the next token is due
            rows.append(seg.q_start + n - 1)
            samplers.append(seq)

    return StepBatch(
        tokens=torch.tensor(tokens, dtype=torch.long),
        positions=torch.tensor(positions, dtype=torch.long),
        segments=segments,
        logit_rows=torch.tensor(rows, dtype=torch.long),
        scheduled=scheduled,
        samplers=samplers,
    )
