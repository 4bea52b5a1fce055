"""A decode step's end, on the device: hand each row's greedy id to the host and move the step table on.

A replayed decode graph used to be framed by two copies: the step table (positions, write slots, segment
kv_end) up before it, the greedy ids down after it. In steady decoding neither is needed. When a row's
id is known (the argmax's last program for that row), that program also

- writes the id into pinned host memory (mapped: the host reads it once the step's event has passed),
  at ring slot `position % HOST_RING`, so the look-ahead step queued behind never overwrites ids the
  host has not read yet, and
- advances that row's position, its write slot in each window kind's storage and its segment's
  kv_end by one token: exactly the table of the next decode step of the same sequences, which the
  host then does not send.

Rows whose segment is not that row alone (padding) are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

HOST_RING = 4  # steps of ids the host may have outstanding: look-ahead keeps at most two


@dataclass(slots=True)
class StepAdvance:
    """Where the advancing argmax writes: host ids and the device step table it moves on."""

    host_ids: torch.Tensor  # (HOST_RING, >= rows) int64, pinned host memory
    seq_info: torch.Tensor  # (S, 4) int32: q_start, q_len, column, kv_end
    positions: torch.Tensor  # (>= rows,) int64
    slots: torch.Tensor  # (kinds, stride) int64 view: row r's write slot for window kind k at [k, r]
    rings: torch.Tensor  # (kinds,) int64 device: ring rows of each window kind, 0 for flat storage
    columns: int  # storage columns: slot = row * columns + column


@triton.jit
def read_row(row, SeqInfo, num_segments, Positions, Rings, KINDS: tl.constexpr, KINDS_P2: tl.constexpr):
    """What `advance_row` needs, loaded early (at the kernel's start: the loads overlap its real work, and the
    row's last program then has them at hand). `live`: the row's segment is that row alone."""
    r = tl.where(row < num_segments, row, 0)
    q_start = tl.load(SeqInfo + r * 4 + 0)
    q_len = tl.load(SeqInfo + r * 4 + 1)
    column = tl.load(SeqInfo + r * 4 + 2).to(tl.int64)
    kv_end = tl.load(SeqInfo + r * 4 + 3)
    pos = tl.load(Positions + r)
    k = tl.arange(0, KINDS_P2)
    rings = tl.load(Rings + k, mask=k < KINDS, other=0)
    live = (row < num_segments) & (q_len == 1) & (q_start == row)
    return live, column, kv_end, pos, rings


@triton.jit
def advance_row(row, token, live, column, kv_end, pos, rings, HostIds, host_stride, SeqInfo, Positions, Slots,
                slot_stride, columns, KINDS: tl.constexpr, KINDS_P2: tl.constexpr, RING: tl.constexpr):
    """Called once per row with its final id and `read_row`'s values (see the module docstring)."""
    if live:
        tl.store(HostIds + (pos % RING) * host_stride + row, token)
        nxt = pos + 1
        tl.store(Positions + row, nxt)
        tl.store(SeqInfo + row * 4 + 3, kv_end + 1)
        k = tl.arange(0, KINDS_P2)
        storage_row = tl.where(rings > 0, nxt % tl.maximum(rings, 1), nxt)
        tl.store(Slots + k * slot_stride + row, storage_row * columns + column, mask=k < KINDS)


def advance_args(step: StepAdvance | None, like: torch.Tensor) -> tuple[tuple, dict]:
    """The kernel arguments for `advance_row` (placeholders when `step` is None) and its constexprs."""
    if step is None:
        return (like, 0, like, 0, like, like, 0, like, 0), {"KINDS": 1, "KINDS_P2": 2, "RING": HOST_RING,
                                                            "ADVANCE": False}
    assert step.host_ids.shape[0] == HOST_RING and step.slots.stride(1) == 1 and step.seq_info.is_contiguous()
    args = (step.host_ids, step.host_ids.stride(0), step.seq_info, step.seq_info.shape[0], step.positions,
            step.slots, step.slots.stride(0), step.rings, step.columns)
    kinds = step.rings.numel()
    return args, {"KINDS": kinds, "KINDS_P2": max(2, triton.next_power_of_2(kinds)), "RING": HOST_RING,
                  "ADVANCE": True}


def host_ring(rows: int) -> torch.Tensor:
    """Pinned (HOST_RING, rows) int64 for the ids; a kernel writes it through the GPU's mapping of it."""
    return torch.zeros(HOST_RING, rows, dtype=torch.int64, pin_memory=torch.cuda.is_available())

