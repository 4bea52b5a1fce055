"""A sampled decode step's draw on the GPU: temperature, top-k / top-p / min-p, and the id-order inverse-CDF draw at
each row's uniform number (engine/sampling.py defines it; `draw(*candidates(...))` there is the torch reference).
torch's version of it is 20-60 small launches and host-to-device copies a step, which on an H200 made sampled
decoding of the 270M 3-5× slower than greedy.

Every pass over a whole row is split in blocks of SPLIT logits, a program per (row, block), each writing its block's
partial to a (rows, blocks) table that a program per row then reads in a fixed order: so a row's token never depends
on what shares the launch, and one row's 262,144 logits are read by 64 programs, not walked by one.
- the row's maximum and its total weight exp((x - max) / T) (a block's sum in fp32, the blocks' in fp64);
- rows with candidates (a top-k of their logits, ranked by torch.topk): each candidate's rank (by weight, ties by
  id) and the mass above it, by comparisons in chunks, then the kept prefix and the draw among the kept in id
  order. An open row (top-p / min-p without top-k) whose boundary is not among its candidates goes on as:
- the whole row: the nucleus's lowest logit by a search over the logits' ordered bits (16 thresholds a round, 9
  rounds; flat rows only), the tokens tied with it kept in id order, the min-p floor, then the draw over the kept
  weights in id order: the block where the fp64 running sum passes u times the kept total, then the token inside it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT = 4096  # logits of a row a block program reads (the embedded model's 262,144: 64 programs a row)
SPLIT_INTERPRETED = 512  # on the CPU's interpreter: small rows still span several blocks (tested)
WAYS = 16  # thresholds a pass of the nucleus search tries at once: 4 bits of the key a pass
SEARCH = 1024  # logits a pass of that search reads at a time (a (SEARCH, WAYS) tile)
SEARCH_ROUNDS = 9  # WAYS ways a round: the 2^32 ordered keys narrowed to one
CHUNK = 16  # candidates compared against all the others at a time
PARAMS = 5  # per row: temperature, top-k (0 none), top-p, min-p, u


@triton.jit
def _ordered(x):
    """fp32 -> int32 whose signed order is the floats' order."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


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
def _params(PARAMS_, r):
    """A row's (1 / temperature as fp32, top-k, top-p, min-p, u)."""
    t = tl.load(PARAMS_ + r * 5 + 0)
    top_k = tl.load(PARAMS_ + r * 5 + 1).to(tl.int32)
    return ((1.0 / t).to(tl.float32), top_k, tl.load(PARAMS_ + r * 5 + 2), tl.load(PARAMS_ + r * 5 + 3),
            tl.load(PARAMS_ + r * 5 + 4))


@triton.jit
def _row_max(MAXES, r, NB, NBP: tl.constexpr):
    j = tl.arange(0, NBP)
    return tl.max(tl.load(MAXES + r * NB + j, mask=j < NB, other=float("-inf")), 0)


@triton.jit
def _row_sum(TABLE, r, NB, NBP: tl.constexpr):
    """A row's fp64 partials added up (the same order whatever shares the launch)."""
    j = tl.arange(0, NBP)
    return tl.sum(tl.load(TABLE + r * NB + j, mask=j < NB, other=0.0), 0)


@triton.jit
def _block_max(X, stride_x, V, MAXES, NB, SPLIT: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    offs = b * SPLIT + tl.arange(0, SPLIT)
    x = tl.load(X + r * stride_x + offs, mask=offs < V, other=float("-inf"))
    tl.store(MAXES + r * NB + b, tl.max(x, 0))


@triton.jit
def _block_sums(X, stride_x, V, PARAMS_, MAXES, SUMS, NB, SPLIT: tl.constexpr, NBP: tl.constexpr):
    """Each block's total weight exp((x - the row's max) / T)."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    inv_t = _params(PARAMS_, r)[0]
    m = _row_max(MAXES, r, NB, NBP)
    offs = b * SPLIT + tl.arange(0, SPLIT)
    x = tl.load(X + r * stride_x + offs, mask=offs < V, other=float("-inf"))
    tl.store(SUMS + r * NB + b, tl.sum(tl.exp((x - m) * inv_t), 0).to(tl.float64))


@triton.jit
def _sample_rows(X, stride_x, V, PARAMS_, MAXES, SUMS, OUT, CUT, BOUNDS, CAND_X, CAND_IDS, W, stride_c, SCRATCH, NB,
                 NBP: tl.constexpr, WB: tl.constexpr, CHUNK: tl.constexpr, CANDIDATES: tl.constexpr,
                 WHOLE: tl.constexpr):
    """A row's draw among its candidates; -1 in OUT where it goes on over the whole row (WHOLE), with its cut set to
    keep every token and its nucleus search's bounds to every key below its maximum."""
    r = tl.program_id(0).to(tl.int64)
    inv_t, top_k, top_p, min_p, u = _params(PARAMS_, r)
    m = _row_max(MAXES, r, NB, NBP)
    total = _row_sum(SUMS, r, NB, NBP)
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
        in_k = valid & (rank < limit)
        # top-p over what top-k keeps, renormalised, as llama.cpp's chain and transformers' processors apply it
        scale = tl.where(top_k > 0, tl.sum(tl.where(in_k, p, 0.0), 0), 1.0)
        top_p_all = tl.zeros([WB], tl.float64) + top_p  # (a scalar bool does not broadcast in the interpreter)
        keep = in_k & ((before < top_p_all * scale) | (top_p_all >= 1)) & (p >= min_p * p_max)
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
    if WHOLE:
        if token < 0:  # no filter, or an open row whose boundary lies past its candidates: the whole row
            tl.store(CUT + r * 2, _ordered(tl.full([], -3.4028234663852886e38, tl.float32)))
            tl.store(CUT + r * 2 + 1, V - 1)
            tl.store(BOUNDS + r * 2, _ordered(tl.full([], -3.4028234663852886e38, tl.float32)).to(tl.int64))
            tl.store(BOUNDS + r * 2 + 1, _ordered(m).to(tl.int64))
            tl.store(OUT + r, token)
        else:
            tl.store(OUT + r, tl.minimum(token, V - 1))
    else:
        tl.store(OUT + r, tl.minimum(tl.maximum(token, 0), V - 1))


@triton.jit
def _searching(OUT, PARAMS_, r):
    """Whether a row looks for its nucleus over the whole row (no token from its candidates, a top-p below 1)."""
    return (tl.load(OUT + r) < 0) & (tl.load(PARAMS_ + r * 5 + 2) < 1)


@triton.jit
def _keys(BOUNDS, r, WAYS: tl.constexpr):
    """A search round's bounds (lo, hi) and the WAYS keys it tries: [lo, hi] holds the nucleus's lowest key."""
    lo = tl.load(BOUNDS + r * 2)
    hi = tl.load(BOUNDS + r * 2 + 1)
    j = tl.arange(0, WAYS).to(tl.int64)
    return lo, hi, lo + ((hi - lo) // WAYS + 1) * (j + 1)


@triton.jit
def _search_masses(X, stride_x, V, PARAMS_, MAXES, OUT, BOUNDS, MASSES, NB, SPLIT: tl.constexpr, NBP: tl.constexpr,
                   WAYS: tl.constexpr, SEARCH: tl.constexpr):
    """A block's weight at or above each of its row's search keys."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    if _searching(OUT, PARAMS_, r):
        inv_t = _params(PARAMS_, r)[0]
        m = _row_max(MAXES, r, NB, NBP)
        keys = _keys(BOUNDS, r, WAYS)[2].to(tl.int32)
        mass = tl.zeros([WAYS], tl.float64)
        for s in range(0, SPLIT, SEARCH):
            offs = b * SPLIT + s + tl.arange(0, SEARCH)
            x = tl.load(X + r * stride_x + offs, mask=offs < V, other=float("-inf"))
            w = tl.where(offs < V, tl.exp((x - m) * inv_t), 0.0)
            above = _ordered(x)[:, None] >= keys[None, :]
            mass += tl.sum(tl.where(above, w[:, None], 0.0), 0).to(tl.float64)
        tl.store(MASSES + (r * NB + b) * WAYS + tl.arange(0, WAYS), mass)


@triton.jit
def _search_narrow(PARAMS_, SUMS, OUT, BOUNDS, MASSES, NB, NBP: tl.constexpr, WAYS: tl.constexpr):
    """A round's bounds narrowed: lo to the largest key whose mass at or above reaches top-p, hi below the others."""
    r = tl.program_id(0).to(tl.int64)
    if _searching(OUT, PARAMS_, r):
        target = tl.load(PARAMS_ + r * 5 + 2) * _row_sum(SUMS, r, NB, NBP)
        lo, hi, keys = _keys(BOUNDS, r, WAYS)
        b = tl.arange(0, NBP)
        j = tl.arange(0, WAYS)
        at = MASSES + (r * NB + b[:, None]) * WAYS + j[None, :]
        mass = tl.sum(tl.load(at, mask=(b < NB)[:, None], other=0.0), 0)
        inside = keys <= hi
        ok = mass >= target
        tl.store(BOUNDS + r * 2, tl.max(tl.where(inside & ok, keys, lo), 0))
        tl.store(BOUNDS + r * 2 + 1, tl.min(tl.where(inside & ~ok, keys - 1, hi), 0))


@triton.jit
def _tie_stats(X, stride_x, V, PARAMS_, MAXES, OUT, BOUNDS, ABOVE, TIED, TIE_W, NB, SPLIT: tl.constexpr,
               NBP: tl.constexpr):
    """A block's weight above the nucleus's lowest key, its count of tokens at that key and their weight."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    if _searching(OUT, PARAMS_, r):
        inv_t = _params(PARAMS_, r)[0]
        m = _row_max(MAXES, r, NB, NBP)
        key = tl.load(BOUNDS + r * 2).to(tl.int32)
        offs = b * SPLIT + tl.arange(0, SPLIT)
        x = tl.load(X + r * stride_x + offs, mask=offs < V, other=float("-inf"))
        k = _ordered(x)
        w = tl.exp((x - m) * inv_t)
        at = (k == key) & (offs < V)
        tl.store(ABOVE + r * NB + b, tl.sum(tl.where((k > key) & (offs < V), w, 0.0), 0).to(tl.float64))
        tl.store(TIED + r * NB + b, tl.sum(at.to(tl.int32), 0))
        tl.store(TIE_W + r * NB + b, tl.max(tl.where(at, w, 0.0), 0).to(tl.float64))


@triton.jit
def _tie_cut(X, stride_x, V, PARAMS_, SUMS, OUT, BOUNDS, CUT, ABOVE, TIED, TIE_W, NB, SPLIT: tl.constexpr,
             NBP: tl.constexpr):
    """The cut: the nucleus's lowest key, and the last id kept among the tokens at it (ties in id order: the i-th,
    from 0, is kept while the mass above plus i of their weights stays under top-p)."""
    r = tl.program_id(0).to(tl.int64)
    if _searching(OUT, PARAMS_, r):
        target = tl.load(PARAMS_ + r * 5 + 2) * _row_sum(SUMS, r, NB, NBP)
        key = tl.load(BOUNDS + r * 2).to(tl.int32)
        b = tl.arange(0, NBP)
        counts = tl.load(TIED + r * NB + b, mask=b < NB, other=0)
        tied = tl.sum(counts, 0)
        weight = tl.max(tl.load(TIE_W + r * NB + b, mask=b < NB, other=0.0), 0)
        above = _row_sum(ABOVE, r, NB, NBP)
        keep = tl.minimum(tl.ceil((target - above) / weight), tied.to(tl.float64)).to(tl.int32)  # weight > 0 there
        keep = tl.maximum(keep, 1)
        last = V - 1
        if keep < tied:  # the keep-th tied id: in the first block whose running count reaches keep
            run = tl.cumsum(counts, 0)
            block = tl.min(tl.where((run >= keep) & (b < NB), b, NB - 1), 0)
            need = keep - tl.sum(tl.where(b < block, counts, 0), 0)
            offs = block * SPLIT + tl.arange(0, SPLIT)
            x = tl.load(X + r * stride_x + offs, mask=offs < V, other=float("-inf"))
            at = (_ordered(x) == key) & (offs < V)
            last = tl.min(tl.where(at & (tl.cumsum(at.to(tl.int32), 0) >= need), offs, V), 0)
        tl.store(CUT + r * 2, key)
        tl.store(CUT + r * 2 + 1, last)


@triton.jit
def _kept_sums(X, stride_x, V, PARAMS_, MAXES, OUT, CUT, KEPT, NB, SPLIT: tl.constexpr, NBP: tl.constexpr):
    """A block's kept weight (`_kept_block`) for each row drawing over the whole row."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    if tl.load(OUT + r) < 0:
        inv_t, _, _, min_p, _ = _params(PARAMS_, r)
        m = _row_max(MAXES, r, NB, NBP)
        key = tl.load(CUT + r * 2)
        last = tl.load(CUT + r * 2 + 1)
        _, w, _ = _kept_block(X + r * stride_x, b * SPLIT, V, m, inv_t, key, last, min_p.to(tl.float32), SPLIT)
        tl.store(KEPT + r * NB + b, tl.sum(w, 0).to(tl.float64))


@triton.jit
def _draw_rows(X, stride_x, V, PARAMS_, MAXES, OUT, CUT, KEPT, NB, SPLIT: tl.constexpr, NBP: tl.constexpr):
    """The id-order draw over a row's kept tokens: the block where the running sum passes u times the kept total,
    then the token inside it (where rounding leaves none, the block's last kept token)."""
    r = tl.program_id(0).to(tl.int64)
    if tl.load(OUT + r) < 0:
        inv_t, _, _, min_p, u = _params(PARAMS_, r)
        m = _row_max(MAXES, r, NB, NBP)
        key = tl.load(CUT + r * 2)
        last = tl.load(CUT + r * 2 + 1)
        b = tl.arange(0, NBP)
        kept = tl.load(KEPT + r * NB + b, mask=b < NB, other=0.0)
        target = u * tl.sum(kept, 0)
        run = tl.cumsum(kept, 0)
        hit = (b < NB) & ((run > target) | ((b == NB - 1) & (kept > 0)))
        block = tl.min(tl.where(hit, b, NBP), 0)
        block = tl.where(block < NBP, block, 0)
        below = tl.sum(tl.where(b == block, run - kept, 0.0), 0)
        offs, w, keep = _kept_block(X + r * stride_x, block * SPLIT, V, m, inv_t, key, last, min_p.to(tl.float32),
                                    SPLIT)
        within = below + tl.cumsum(w.to(tl.float64), 0)
        passed = tl.min(tl.where((within > target) & keep, offs, V), 0)
        last_kept = tl.max(tl.where(keep, offs, -1), 0)
        token = tl.where(passed < V, passed, tl.maximum(last_kept, 0))
        tl.store(OUT + r, tl.minimum(tl.maximum(token, 0), V - 1).to(tl.int64))


def sample_rows_triton(logits: torch.Tensor, params: torch.Tensor,
                       candidates: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                       whole: bool = True, nucleus: bool = True) -> torch.Tensor:
    """logits (R, V) fp32, unit column stride; `params` (R, 5) fp64 on the same device: temperature (> 0), top-k
    (0: none), top-p, min-p, u in [0, 1). `candidates`: (logits, ids) (R, W) of each row's W largest logits, W at
    least every row's top-k (required for top-k rows; for open rows a first guess of their nucleus). -> (R,) int64.
    `whole`: some row may draw over the whole row (a row without top-k); `nucleus`: some such row has a top-p below 1
    (False skips the search's 20 launches). Both True unless the caller knows its rows' kinds."""
    R, V = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1 and params.shape == (R, PARAMS)
    assert params.dtype == torch.float64 and params.is_contiguous()
    out = torch.empty(R, dtype=torch.int64, device=logits.device)
    if R == 0:
        return out
    split = SPLIT_INTERPRETED if logits.device.type == "cpu" else SPLIT
    nb = triton.cdiv(V, split)
    nbp = triton.next_power_of_2(nb)
    sizes = dict(SPLIT=split, NBP=nbp)
    f64 = torch.empty(4 if whole and nucleus else 2, R, nb, dtype=torch.float64, device=logits.device)  # one allocation
    sums, kept = f64[0], f64[1]
    maxes = torch.empty(R, nb, dtype=torch.float32, device=logits.device)
    cut = torch.empty(R, 2, dtype=torch.int32, device=logits.device)
    bounds = torch.empty(R, 2, dtype=torch.int64, device=logits.device)
    x = (logits, logits.stride(0), V)
    _block_max[(R, nb)](*x, maxes, nb, SPLIT=split, num_warps=4)
    if candidates is not None or nucleus and whole:  # the rows' totals: read by the candidates' ranks and the search
        _block_sums[(R, nb)](*x, params, maxes, sums, nb, **sizes, num_warps=4)
    if candidates is None:
        cx, cid, w = logits, out, 0  # unused
    else:
        cx, cid = candidates
        cx, cid, w = cx.contiguous(), cid.contiguous(), cx.shape[1]
    wb = max(CHUNK, triton.next_power_of_2(max(w, 1)))
    scratch = torch.empty(R, wb, dtype=torch.float64, device=logits.device) if candidates is not None else out
    _sample_rows[(R,)](*x, params, maxes, sums, out, cut, bounds, cx, cid, w, cid.stride(0) if w else 0, scratch, nb,
                       NBP=nbp, WB=wb, CHUNK=CHUNK, CANDIDATES=candidates is not None, WHOLE=whole, num_warps=8)
    if not whole:
        return out
    if nucleus:
        above, weight = f64[2], f64[3]
        masses = torch.empty(R, nb, WAYS, dtype=torch.float64, device=logits.device)
        search = min(SEARCH, split)
        for _ in range(SEARCH_ROUNDS):
            _search_masses[(R, nb)](*x, params, maxes, out, bounds, masses, nb, **sizes, WAYS=WAYS, SEARCH=search,
                                    num_warps=4)
            _search_narrow[(R,)](params, sums, out, bounds, masses, nb, NBP=nbp, WAYS=WAYS, num_warps=1)
        tied = torch.empty(R, nb, dtype=torch.int32, device=logits.device)
        _tie_stats[(R, nb)](*x, params, maxes, out, bounds, above, tied, weight, nb, **sizes, num_warps=4)
        _tie_cut[(R,)](*x, params, sums, out, bounds, cut, above, tied, weight, nb, **sizes, num_warps=4)
    _kept_sums[(R, nb)](*x, params, maxes, out, cut, kept, nb, **sizes, num_warps=4)
    _draw_rows[(R,)](*x, params, maxes, out, cut, kept, nb, **sizes, num_warps=4)
    return out
