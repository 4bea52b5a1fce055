"""Row-wise argmax of a decode step's logits in one launch, inside the step's CUDA graph.

torch's argmax over one 262,144-wide row runs a few blocks for ~8 us on an H200, after the graph, as
its own launch. Here each program reduces one BLOCK of a row to a 64-bit key — the value's bits made
order-preserving as a signed int in the high half, the complement of the index in the low half, so
the largest key is the largest value and, among equal values, the lowest index (torch's choice) — and
folds it into the row's key with an atomic max. Max is order-independent, so the result is the same
whatever order programs run in. The program that arrives last (a counter per row) writes the index and
puts the key and the counter back to their start values, so the scratch needs no reset between steps.
Given a `StepAdvance`, that program also ends the decode step (kernels/step_advance.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, wait_for_previous
from kernels.step_advance import StepAdvance, advance_args, advance_row, read_row

BLOCK = 8192  # 32 programs for a 262k vocabulary: few atomics on the row's key
KEY_START = -(2**63)  # below every key


@triton.jit
def _argmax_rows(X, OUT, KEYS, COUNTS, V, stride_x, CHUNKS,
                 HostIds, host_stride, SeqInfo, num_segments, Positions, Slots, slot_stride, Rings, columns,
                 BLOCK: tl.constexpr, PDL: tl.constexpr, ADVANCE: tl.constexpr, KINDS: tl.constexpr,
                 KINDS_P2: tl.constexpr, RING: tl.constexpr):
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    if ADVANCE:
        live, column, kv_end, pos, rings = read_row(row, SeqInfo, num_segments, Positions, Rings, KINDS, KINDS_P2)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row * stride_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # signed-int order == float order (NaN above +inf)
    key = (ordered.to(tl.int64) << 32) | (0xFFFFFFFF - offs.to(tl.int64))
    tl.atomic_max(KEYS + row, tl.max(key, 0))
    if tl.atomic_add(COUNTS + row, 1) == CHUNKS - 1:  # the last program of this row
        best = tl.atomic_xchg(KEYS + row, tl.full([], -9223372036854775807, tl.int64) - 1)  # KEY_START
        tl.store(COUNTS + row, 0)
        token = 0xFFFFFFFF - (best & 0xFFFFFFFF)
        tl.store(OUT + row, token)
        if ADVANCE:
            advance_row(row, token, live, column, kv_end, pos, rings, HostIds, host_stride, SeqInfo, Positions,
                        Slots, slot_stride, columns, KINDS, KINDS_P2, RING)


class ArgmaxScratch:
    """Per-row keys and arrival counters that the kernel leaves at their start values after each call."""

    def __init__(self, rows: int, device: torch.device):
        self.keys = torch.full((rows,), KEY_START, dtype=torch.int64, device=device)
        self.counts = torch.zeros(rows, dtype=torch.int32, device=device)


def argmax_rows_triton(logits: torch.Tensor, scratch: ArgmaxScratch, out: torch.Tensor | None = None,
                       block: int = BLOCK, step: StepAdvance | None = None) -> torch.Tensor:
    """logits (R, V) float -> (R,) int64 index of each row's maximum (the first one on ties). With `step`,
    each row's id also goes to the host and the decode step table moves on (kernels/step_advance.py)."""
    R, V = logits.shape
    assert logits.stride(1) == 1 and R <= scratch.keys.numel() and V < 2**32, (logits.shape, logits.stride())
    out = torch.empty(R, dtype=torch.int64, device=logits.device) if out is None else out
    if R:
        chunks = triton.cdiv(V, block)
        tail, flags = advance_args(step, out)
        _argmax_rows[(R, chunks)](logits, out, scratch.keys, scratch.counts, V, logits.stride(0), chunks, *tail,
                                  BLOCK=block, num_warps=8 if block >= 4096 else 4, **flags, **launch_options(logits))
    return out
