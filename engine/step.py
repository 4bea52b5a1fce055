"""build_step: one pass over the scheduled sequences lays out the flat token axis of one forward."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.cache import KVCache, Segment
from engine.sequence import Sequence


@dataclass(slots=True)
class StepBatch:
    tokens: torch.Tensor  # (T,) entry i of tokens/positions/slots names the same token
    positions: torch.Tensor  # (T,)
    slots: torch.Tensor  # (T,) cache slot of each token
    segments: list[Segment]
    logit_rows: torch.Tensor  # (R,) rows whose logits are sampled: each sampling sequence's last token
    scheduled: list[tuple[Sequence, int]]
    samplers: list[Sequence]  # the sequences that sample this step, in logit_rows order


def build_step(scheduled: list[tuple[Sequence, int]], cache: KVCache, device: torch.device | str) -> StepBatch:
    """Declares the step to the cache and emits tokens, positions, slots and the rows to sample."""
    segments = cache.declare_step([(seq.slot, n) for seq, n in scheduled])
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    rows: list[int] = []
    samplers: list[Sequence] = []
    for (seq, n), seg in zip(scheduled, segments):
        tokens += seq.token_ids[seq.num_cached : seq.num_cached + n]
        positions += range(seg.start, seg.start + n)
        slots += [seg.slot] * n
        if seq.num_cached + n == len(seq.token_ids):  # this chunk reaches the end: the next token is due
            rows.append(seg.q_start + n - 1)
            samplers.append(seq)

    def as_tensor(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.long).to(device, non_blocking=True)

    return StepBatch(
        tokens=as_tensor(tokens),
        positions=as_tensor(positions),
        slots=as_tensor(slots),
        segments=segments,
        logit_rows=as_tensor(rows),
        scheduled=scheduled,
        samplers=samplers,
    )
