"""Each row's k largest logits on the GPU (the draw's candidates: kernels/sampling_triton.py), ties taken by id.

torch.topk ranked a sampled step's candidates in ~50 µs for one 262,144-logit row and ~230 µs for 64 rows on an
H200, the largest part of a drawn step at 64 sessions. Here a radix select over the logits' ordered bits finds each
row's k-th largest key, 8 bits a round over 4 rounds: a program per (row, block of SPLIT logits) counts its block's
next digit among the logits that match the row's bits so far (a histogram), and a program per row adds the blocks'
counts in a fixed order and fixes the digit. Then each block writes its logits above that key, and those at it in id
order while the row still needs them, at offsets the blocks before it give. So the set is exact (torch.topk keeps
an arbitrary subset of tied logits), and a row's candidates never depend on what shares the launch.
`torch_topk_reference` is the plain definition the tests compare with.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT = 4096  # logits of a row a block program reads
SPLIT_INTERPRETED = 512  # on the CPU's interpreter: small rows still span several blocks (tested)
DIGIT = 8  # bits of the key a round fixes
BINS = 1 << DIGIT


@triton.jit
def _unsigned_key(x):
    """fp32 -> int64 in [0, 2^32) whose order is the floats' order (NaN above +inf, as torch.topk ranks it)."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return ordered.to(tl.int64) + 2147483648


@triton.jit
def _block_keys(X, stride_x, V, r, b, SPLIT: tl.constexpr):
    offs = b * SPLIT + tl.arange(0, SPLIT)
    x = tl.load(X + r * stride_x + offs, mask=offs < V, other=0.0)
    return offs, x, _unsigned_key(x), offs < V


@triton.jit
def _digit_counts(X, stride_x, V, STATE, COUNTS, NB, SHIFT: tl.constexpr, FIRST: tl.constexpr,
                  SPLIT: tl.constexpr, BINS: tl.constexpr):
    """A block's count of each value of the key's digit at SHIFT among its logits whose higher bits are the row's
    prefix so far."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    _, _, key, valid = _block_keys(X, stride_x, V, r, b, SPLIT)
    match = valid
    if not FIRST:
        match = valid & ((key >> (SHIFT + 8)) == (tl.load(STATE + r * 2) >> (SHIFT + 8)))
    digit = tl.where(match, (key >> SHIFT) & (BINS - 1), BINS).to(tl.int32)  # BINS: a bin of its own, not stored
    counts = tl.histogram(digit, 2 * BINS)
    j = tl.arange(0, 2 * BINS)
    tl.store(COUNTS + (r * NB + b) * BINS + j, counts, mask=j < BINS)


@triton.jit
def _fix_digit(STATE, COUNTS, NB, K, SHIFT: tl.constexpr, FIRST: tl.constexpr, NBP: tl.constexpr,
               BINS: tl.constexpr):
    """The row's digit at SHIFT: the largest whose count, with every larger digit's, reaches the logits the row still
    needs; those of larger digits are taken, the rest are still needed from it."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.arange(0, NBP)
    d = tl.arange(0, BINS)
    at = COUNTS + (r * NB + b[:, None]) * BINS + d[None, :]
    counts = tl.sum(tl.load(at, mask=(b < NB)[:, None], other=0), 0)
    if FIRST:
        prefix = tl.zeros([], tl.int64)
        need = tl.zeros([], tl.int64) + K
    else:
        prefix = tl.load(STATE + r * 2)
        need = tl.load(STATE + r * 2 + 1)
    at_or_above = tl.sum(counts, 0) - tl.cumsum(counts, 0) + counts  # logits with this digit or a larger one
    digit = tl.max(tl.where(at_or_above >= need, d, 0), 0)
    above = tl.sum(tl.where(d > digit, counts, 0), 0)
    tl.store(STATE + r * 2, prefix | (digit.to(tl.int64) << SHIFT))
    tl.store(STATE + r * 2 + 1, need - above)


@triton.jit
def _block_split(X, stride_x, V, STATE, ABOVE, AT, NB, SPLIT: tl.constexpr):
    """A block's count of logits above the row's k-th key and at it."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    _, _, key, valid = _block_keys(X, stride_x, V, r, b, SPLIT)
    kth = tl.load(STATE + r * 2)
    tl.store(ABOVE + r * NB + b, tl.sum((valid & (key > kth)).to(tl.int32), 0))
    tl.store(AT + r * NB + b, tl.sum((valid & (key == kth)).to(tl.int32), 0))


@triton.jit
def _write(X, stride_x, V, STATE, ABOVE, AT, OUT_X, OUT_IDS, NB, K, SPLIT: tl.constexpr, NBP: tl.constexpr):
    """A block's logits above the k-th key, then those at it in id order while the row needs them, at the offsets
    the blocks before it leave."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    j = tl.arange(0, NBP)
    above = tl.load(ABOVE + r * NB + j, mask=j < NB, other=0)
    at = tl.load(AT + r * NB + j, mask=j < NB, other=0)
    first_above = tl.sum(tl.where(j < b, above, 0), 0)
    first_at = tl.sum(tl.where(j < b, at, 0), 0)
    taken_above = tl.sum(above, 0)
    need = tl.load(STATE + r * 2 + 1).to(tl.int32)
    offs, x, key, valid = _block_keys(X, stride_x, V, r, b, SPLIT)
    kth = tl.load(STATE + r * 2)
    is_above = valid & (key > kth)
    is_at = valid & (key == kth)
    rank_at = first_at + tl.cumsum(is_at.to(tl.int32), 0) - 1
    slot = tl.where(is_above, first_above + tl.cumsum(is_above.to(tl.int32), 0) - 1, taken_above + rank_at)
    keep = is_above | (is_at & (rank_at < need))
    tl.store(OUT_X + r * K + slot, x, mask=keep)
    tl.store(OUT_IDS + r * K + slot, offs.to(tl.int64), mask=keep)


def topk_triton(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (R, V) fp32, unit column stride -> (values, ids), each (R, k): every row's k largest logits (ties by
    id; 1 <= k <= V), in no particular order, as torch.topk(sorted=False) gives them."""
    R, V = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1 and 1 <= k <= V, (logits.shape, k)
    values = torch.empty(R, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(R, k, dtype=torch.int64, device=logits.device)
    if R == 0:
        return values, ids
    split = SPLIT_INTERPRETED if logits.device.type == "cpu" else SPLIT
    nb = triton.cdiv(V, split)
    nbp = triton.next_power_of_2(nb)
    state = torch.empty(R, 2, dtype=torch.int64, device=logits.device)  # the key's bits so far, logits still needed
    counts = torch.empty(R, nb, BINS, dtype=torch.int32, device=logits.device)
    x = (logits, logits.stride(0), V)
    for shift in range(32 - DIGIT, -1, -DIGIT):
        first = shift == 32 - DIGIT
        _digit_counts[(R, nb)](*x, state, counts, nb, SHIFT=shift, FIRST=first, SPLIT=split, BINS=BINS, num_warps=4)
        _fix_digit[(R,)](state, counts, nb, k, SHIFT=shift, FIRST=first, NBP=nbp, BINS=BINS, num_warps=4)
    split_counts = torch.empty(2, R, nb, dtype=torch.int32, device=logits.device)
    _block_split[(R, nb)](*x, state, split_counts[0], split_counts[1], nb, SPLIT=split, num_warps=4)
    _write[(R, nb)](*x, state, split_counts[0], split_counts[1], values, ids, nb, k, SPLIT=split, NBP=nbp, num_warps=8)
    return values, ids


def torch_topk_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, in torch: rank by the logits' ordered bits (a NaN above +inf), ties by id, keep the first k."""
    bits = logits.contiguous().view(torch.int32).long()
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    ids = torch.sort(-ordered, dim=-1, stable=True).indices[:, :k]  # stable: equal keys keep id order
    return logits.gather(-1, ids), ids
