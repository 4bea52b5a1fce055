"""Repetition, presence and frequency penalties written into a step's logits on the GPU, and taken back after the
draw, one launch each (engine/sampling.py's `_apply_penalties` is the torch reference: a dozen launches a step).

One program per penalised row: it reads the logits at the row's history ids (padded with the vocabulary size),
keeps them, then writes each seen id's penalised value: v / rep (v > 0) or v * rep, minus presence, minus frequency
times the id's count. An id seen twice is written twice with the same value, from the same original.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 1024  # history ids a program handles at a time


@triton.jit
def _penalise_rows(X, stride_x, V, ROWS, HIST, H, stride_h, PARAMS, COUNTS, ORIGINAL,
                   CHUNK: tl.constexpr, FREQUENCY: tl.constexpr, RESTORE: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    row = X + tl.load(ROWS + i) * stride_x
    if RESTORE:
        for start in range(0, H, CHUNK):
            h = start + tl.arange(0, CHUNK)
            ids = tl.load(HIST + i * stride_h + h, mask=h < H, other=V)
            tl.store(row + ids, tl.load(ORIGINAL + i * H + h, mask=h < H), mask=(h < H) & (ids < V))
    else:
        for start in range(0, H, CHUNK):  # every original first: a duplicate id must not read a penalised value
            h = start + tl.arange(0, CHUNK)
            ids = tl.load(HIST + i * stride_h + h, mask=h < H, other=V)
            tl.store(ORIGINAL + i * H + h, tl.load(row + ids, mask=(h < H) & (ids < V), other=0.0), mask=h < H)
        tl.debug_barrier()
        rep = tl.load(PARAMS + i * 3 + 0)
        presence = tl.load(PARAMS + i * 3 + 1)
        frequency = tl.load(PARAMS + i * 3 + 2)
        for start in range(0, H, CHUNK):
            h = start + tl.arange(0, CHUNK)
            ids = tl.load(HIST + i * stride_h + h, mask=h < H, other=V)
            v = tl.load(ORIGINAL + i * H + h, mask=h < H, other=0.0)
            v = tl.where(v > 0, v / rep, v * rep) - presence
            if FREQUENCY:
                v = v - frequency * tl.load(COUNTS + i * H + h, mask=h < H, other=0.0)
            tl.store(row + ids, v, mask=(h < H) & (ids < V))


def penalise_rows_triton(logits: torch.Tensor, rows: torch.Tensor, hist: torch.Tensor, params: torch.Tensor,
                         counts: torch.Tensor | None = None) -> torch.Tensor:
    """Penalises `rows` (P,) of `logits` (R, V) fp32, contiguous, in place: `hist` (P, H) int64 their ids (V pads),
    `params` (P, 3) fp32 repetition, presence, frequency; `counts` (P, H) fp32 each entry's id's count (None: no
    frequency penalty). Returns the values replaced (P, H), for `restore_rows_triton`."""
    P, H = hist.shape
    assert logits.is_contiguous() and logits.dtype == torch.float32 and hist.stride(1) == 1
    original = torch.empty(P, H, dtype=torch.float32, device=logits.device)
    if P and H:
        _penalise_rows[(P,)](logits, logits.stride(0), logits.shape[1], rows, hist, H, hist.stride(0),
                             params.contiguous(), counts if counts is not None else original, original,
                             CHUNK=CHUNK, FREQUENCY=counts is not None, RESTORE=False, num_warps=4)
    return original


def restore_rows_triton(logits: torch.Tensor, rows: torch.Tensor, hist: torch.Tensor,
                        original: torch.Tensor) -> None:
    """Puts back what `penalise_rows_triton` replaced."""
    P, H = hist.shape
    if P and H:
        _penalise_rows[(P,)](logits, logits.stride(0), logits.shape[1], rows, hist, H, hist.stride(0), original,
                             original, original, CHUNK=CHUNK, FREQUENCY=False, RESTORE=True, num_warps=4)
