"""A sampled decode step's draw on the GPU in one launch: temperature, top-k / top-p / min-p, and the id-order
inverse-CDF draw at each row's uniform number (engine/sampling.py defines it; `draw(*candidates(...))` there is
the torch reference). torch's version of it is 20-60 small launches and host-to-device copies a step, which on an
H200 made sampled decoding of the 270M 3-5× slower than greedy.

One program per row, so a row's token never depends on what shares the launch:
- the row's maximum and its total weight exp((x - max) / T) (fp32 blocks, summed in fp64);
- rows with candidates (a top-k of their logits, ranked by torch.topk): each candidate's rank (by weight, ties by
  id) and the mass above it, by comparisons in chunks, then the kept prefix and the draw among the kept in id
  order. An open row (top-p / min-p without top-k) whose boundary is not among its candidates goes on as:
- the whole row: the nucleus's lowest logit by a search over the logits' ordered bits (16 thresholds a pass, 9
  passes; flat rows only), the tokens tied with it kept in id order (a second search, over ids, when only some are), the min-p floor,
  then the draw over the kept weights in id order: the block where the fp64 running sum passes u times the kept
  total, then the token inside it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 8192  # logits a pass reads at a time (one program walks a row: bytes in flight per step)
WAYS = 16  # thresholds a pass of the nucleus search tries at once: 4 bits of the key a pass
SEARCH = 1024  # logits a pass of that search reads at a time (a (SEARCH, WAYS) tile)
CHUNK = 16  # candidates compared against all the others at a time
PARAMS = 5  # per row: temperature, top-k (0 none), top-p, min-p, u


@triton.jit
def _ordered(x):
    """fp32 -> int32 whose signed order is the floats' order."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _row_max_total(row, V, inv_t, BLOCK: tl.constexpr):
    m = tl.full([], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = tl.maximum(m, tl.max(tl.load(row + offs, mask=offs < V, other=float("-inf")), 0))
    total = tl.zeros([], tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row + offs, mask=offs < V, other=float("-inf"))
        total += tl.sum(tl.exp((x - m) * inv_t), 0).to(tl.float64)
    return m, total


@triton.jit
def _masses_at_or_above(row, V, m, inv_t, keys, WAYS: tl.constexpr, SEARCH: tl.constexpr):
    """The row's weight at or above each of `keys` (WAYS,) ordered keys, in one pass."""
    mass = tl.zeros([WAYS], tl.float64)
    for start in range(0, V, SEARCH):
        offs = start + tl.arange(0, SEARCH)
        x = tl.load(row + offs, mask=offs < V, other=float("-inf"))
        w = tl.where(offs < V, tl.exp((x - m) * inv_t), 0.0)
        above = _ordered(x)[:, None] >= keys[None, :]
        mass += tl.sum(tl.where(above, w[:, None], 0.0), 0).to(tl.float64)
    return mass


@triton.jit
def _nucleus_cut(row, V, m, inv_t, target, BLOCK: tl.constexpr, WAYS: tl.constexpr, SEARCH: tl.constexpr):
    """(the ordered key of the nucleus's lowest logit, the last id kept among the tokens at it): the largest key whose
    mass at or above reaches `target` (a search WAYS ways a pass: 9 passes over 2^32 keys), then the ties kept while
    the mass strictly above them stays under it."""
    lo = _ordered(tl.full([], -3.4028234663852886e38, tl.float32)).to(tl.int64)
    hi = _ordered(m).to(tl.int64)
    j = tl.arange(0, WAYS).to(tl.int64)
    for _ in range(9):  # [lo, hi] holds the key: lo's mass reaches the target, hi + 1's does not
        step = (hi - lo) // WAYS + 1
        keys = lo + step * (j + 1)
        inside = keys <= hi
        ok = _masses_at_or_above(row, V, m, inv_t, keys.to(tl.int32), WAYS, SEARCH) >= target
        new_lo = tl.max(tl.where(inside & ok, keys, lo), 0)
        hi = tl.min(tl.where(inside & ~ok, keys - 1, hi), 0)
        lo = new_lo
    key = lo.to(tl.int32)
    above = tl.zeros([], tl.float64)
    tied = tl.zeros([], tl.int32)
    weight = tl.zeros([], tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row + offs, mask=offs < V, other=float("-inf"))
        k = _ordered(x)
        w = tl.exp((x - m) * inv_t)
        above += tl.sum(tl.where((k > key) & (offs < V), w, 0.0), 0).to(tl.float64)
        at = (k == key) & (offs < V)
        tied += tl.sum(at.to(tl.int32), 0)
        weight = tl.maximum(weight, tl.max(tl.where(at, w, 0.0), 0).to(tl.float64))
    # ties in id order: the i-th (from 0) is kept while above + i * weight < target
    keep = tl.minimum(tl.ceil((target - above) / weight), tied.to(tl.float64)).to(tl.int32)  # weight > 0 there
    keep = tl.maximum(keep, 1)
    last = V - 1
    if keep < tied:  # the keep-th tied id: the smallest id with that many ties at or below it
        lo_id = 0
        hi_id = V - 1
        while lo_id < hi_id:
            mid_id = (lo_id + hi_id) // 2
            count = tl.zeros([], tl.int32)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                x = tl.load(row + offs, mask=offs < V, other=float("-inf"))
                count += tl.sum(((_ordered(x) == key) & (offs <= mid_id) & (offs < V)).to(tl.int32), 0)
            if count >= keep:
                hi_id = mid_id
            else:
                lo_id = mid_id + 1
        last = lo_id
    return key, last


@triton.jit
def _kept_block(row, start, V, m, inv_t, key, last, floor, BLOCK: tl.constexpr):
    """A block's ids, kept weights (0 where dropped) and kept mask: at or above `key` (ids up to `last` among those
    at it) and of weight at least `floor`."""
    offs = start + tl.arange(0, BLOCK)
    x = tl.load(row + offs, mask=offs < V, other=float("-inf"))
    k = _ordered(x)
    w = tl.exp((x - m) * inv_t)
    kept = (offs < V) & ((k > key) | ((k == key) & (offs <= last))) & (w >= floor)
    return offs, tl.where(kept, w, 0.0), kept


@triton.jit
def _draw_whole_row(row, V, m, inv_t, key, last, floor, u, BLOCK: tl.constexpr):
    """The id-order draw over the row's kept tokens (`_kept_block`)."""
    total = tl.zeros([], tl.float64)
    for start in range(0, V, BLOCK):
        _, w, _ = _kept_block(row, start, V, m, inv_t, key, last, floor, BLOCK)
        total += tl.sum(w, 0).to(tl.float64)
    target = u * total
    run = tl.zeros([], tl.float64)
    below = tl.zeros([], tl.float64)
    found = tl.zeros([], tl.int32)
    block = tl.zeros([], tl.int32)
    for start in range(0, V, BLOCK):  # the block where the running sum passes the target (the same sums as above)
        _, w, _ = _kept_block(row, start, V, m, inv_t, key, last, floor, BLOCK)
        s = tl.sum(w, 0).to(tl.float64)
        hit = (found == 0) & ((run + s > target) | ((start + BLOCK >= V) & (s > 0)))
        block = tl.where(hit, start, block)
        below = tl.where(hit, run, below)
        found = tl.where(hit, 1, found)
        run += s
    offs, w, kept = _kept_block(row, block, V, m, inv_t, key, last, floor, BLOCK)
    within = below + tl.cumsum(w.to(tl.float64), 0)
    passed = tl.min(tl.where((within > target) & kept, offs, V), 0)
    last_kept = tl.max(tl.where(kept, offs, -1), 0)
    return tl.where(passed < V, passed, tl.maximum(last_kept, 0))


@triton.jit
def _sample_rows(X, stride_x, V, PARAMS_, OUT, CAND_X, CAND_IDS, W, stride_c, SCRATCH,
                 BLOCK: tl.constexpr, WB: tl.constexpr, CHUNK: tl.constexpr, CANDIDATES: tl.constexpr,
                 WAYS: tl.constexpr, SEARCH: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    row = X + r * stride_x
    t = tl.load(PARAMS_ + r * 5 + 0)
    top_k = tl.load(PARAMS_ + r * 5 + 1).to(tl.int32)
    top_p = tl.load(PARAMS_ + r * 5 + 2)
    min_p = tl.load(PARAMS_ + r * 5 + 3)
    u = tl.load(PARAMS_ + r * 5 + 4)
    inv_t = (1.0 / t).to(tl.float32)
    m, total = _row_max_total(row, V, inv_t, BLOCK)
    token = tl.zeros([], tl.int64) - 1
    if CANDIDATES:
        j = tl.arange(0, WB)
        valid = j < W
        cx = tl.load(CAND_X + r * stride_c + j, mask=valid, other=float("-inf"))
        cid = tl.load(CAND_IDS + r * stride_c + j, mask=valid, other=V)
        p = tl.exp((cx - m) * inv_t).to(tl.float64) / total
        p = tl.where(valid, p, 0.0)
        rank = tl.zeros([WB], tl.int32)
        before = tl.zeros([WB], tl.float64)
        for c in range(0, WB, CHUNK):  # rank and mass above each candidate: by value, ties by id
            i = c + tl.arange(0, CHUNK)
            xi = tl.load(CAND_X + r * stride_c + i, mask=i < W, other=float("-inf"))
            idi = tl.load(CAND_IDS + r * stride_c + i, mask=i < W, other=V)
            pi = tl.where(i < W, tl.exp((xi - m) * inv_t).to(tl.float64) / total, 0.0)
            first = (xi[:, None] > cx[None, :]) | ((xi[:, None] == cx[None, :]) & (idi[:, None] < cid[None, :]))
            first = first & (i < W)[:, None]
            rank += tl.sum(first.to(tl.int32), 0)
            before += tl.sum(tl.where(first, pi[:, None], 0.0), 0)
        p_max = tl.max(p, 0)
        limit = tl.where(top_k > 0, top_k, W)
        top_p_all = tl.zeros([WB], tl.float64) + top_p  # (a scalar bool does not broadcast in the interpreter)
        keep = valid & (rank < limit) & ((before < top_p_all) | (top_p_all >= 1)) & (p >= min_p * p_max)
        keep = keep | (valid & (rank == 0))
        bounded = (top_k > 0) | (W >= V) | (tl.sum((valid & ~keep).to(tl.int32), 0) > 0)
        if bounded:
            w = tl.where(keep, p, 0.0)
            tl.store(SCRATCH + r * WB + j, w)
            tl.debug_barrier()
            cum = tl.zeros([WB], tl.float64)
            for c in range(0, WB, CHUNK):  # each kept candidate's cumulative weight in id order
                i = c + tl.arange(0, CHUNK)
                idi = tl.load(CAND_IDS + r * stride_c + i, mask=i < W, other=V)
                wi = tl.load(SCRATCH + r * WB + i)
                cum += tl.sum(tl.where(idi[:, None] <= cid[None, :], wi[:, None], 0.0), 0)
            target = u * tl.sum(w, 0)
            passed = tl.min(tl.where(keep & (cum > target), cid, V), 0)
            token = tl.where(passed < V, passed, tl.max(tl.where(keep, cid, -1), 0)).to(tl.int64)
    if token < 0:  # no filter, or an open row whose boundary lies past its candidates: the whole row
        key = _ordered(tl.full([], -3.4028234663852886e38, tl.float32))
        last = V - 1
        if top_p < 1:
            key, last = _nucleus_cut(row, V, m, inv_t, top_p * total, BLOCK, WAYS, SEARCH)
        floor = (min_p).to(tl.float32)  # weights are exp((x - max) / T): the maximum's is 1
        token = _draw_whole_row(row, V, m, inv_t, key, last, floor, u, BLOCK).to(tl.int64)
    tl.store(OUT + r, tl.minimum(tl.maximum(token, 0), V - 1))


def sample_rows_triton(logits: torch.Tensor, params: torch.Tensor,
                       candidates: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """logits (R, V) fp32, unit column stride; `params` (R, 5) fp64 on the same device: temperature (> 0), top-k
    (0: none), top-p, min-p, u in [0, 1). `candidates`: (logits, ids) (R, W) of each row's W largest logits, W at
    least every row's top-k (required for top-k rows; for open rows a first guess of their nucleus). -> (R,) int64."""
    R, V = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1 and params.shape == (R, PARAMS)
    assert params.dtype == torch.float64 and params.is_contiguous()
    out = torch.empty(R, dtype=torch.int64, device=logits.device)
    if R == 0:
        return out
    if candidates is None:
        cx, cid, w = logits, out, 0  # unused
    else:
        cx, cid = candidates
        cx, cid, w = cx.contiguous(), cid.contiguous(), cx.shape[1]
    wb = max(CHUNK, triton.next_power_of_2(max(w, 1)))
    scratch = torch.empty(R, wb, dtype=torch.float64, device=logits.device) if candidates is not None else out
    _sample_rows[(R,)](logits, logits.stride(0), V, params, out, cx, cid, w, cid.stride(0) if w else 0, scratch,
                       BLOCK=BLOCK, WB=wb, CHUNK=CHUNK, CANDIDATES=candidates is not None,
                       WAYS=WAYS, SEARCH=SEARCH, num_warps=16)
    return out
