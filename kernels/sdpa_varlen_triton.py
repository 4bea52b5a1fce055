"""Triton varlen attention over the batched-sequence KV store (DESIGN.md §4-§5).

One program owns (segment, query tile, KV head, kv split). Its M axis holds the G query
heads of one KV head times BLOCK_Q query rows (m -> query m // G, head m % G), so each K/V
tile is loaded once for the whole group. Lengths come from the device segment table; the
grid comes from host ints (S, max_q_len, max_kv_len), so one captured CUDA graph serves
any mix of lengths. Split-K: the kv range of a tile is cut into NUM_SPLITS pieces on the
device; each piece writes a normalised partial output and its log-sum-exp, and a second
small kernel merges them, split by split in order. A planned split is a piece of the row's own keys at fixed
positions: BLOCK_N keys until the row has TARGET_SPLITS of them, then twice as many each time the row's keys
double, so a row's sums depend on its own keys only (batch invariance) and a short row still spreads over
several programs. A forced `num_splits` divides each tile's keys evenly instead (tests, benchmarks).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, wait_for_previous

LOG2E = 1.4426950408889634
LOG2E_C = tl.constexpr(LOG2E)
# Split bounds come from each row's own keys, so a row's sums never depend on the rest of its step (the other rows'
# lengths, how many segments there are): batched == alone, and a verify row equals the decode step at its position.
# The tile width is fixed per head dim for the same reason. At chat length (~200 keys) one split of all keys cost
# 8 µs a layer against 4.5 for 32-key splits and their merge (H200, docs/ENGINE.md): short rows take one tile a split.
# 32 from a sweep of 8-64 (docs/ENGINE.md): 64 one-tile splits cost more in partials and merge than they gained
# in programs (270M decode at 4k keys 18.3 µs against 8.7, 8B at 16k 38 against 24, its 256-row chunk 465 vs 330).
TARGET_SPLITS = 32  # a row's splits before their width doubles (the merge adds at most this many, plus one)
INTERPRET_TARGET_SPLITS = 2  # the interpreter (CI): widths double on short test sequences too
MAX_DOUBLINGS = tl.constexpr(16)  # split widths up to BLOCK_N * TARGET_SPLITS * 2^16 keys


@triton.jit
def _tile_rows(seq_info_ptr, pid_sq, q_tiles, G: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr):
    # -- read this program's segment and lay out its M rows as (query row, head in group)
    seg = pid_sq // q_tiles
    qt = pid_sq % q_tiles
    q_start = tl.load(seq_info_ptr + seg * 4 + 0)
    q_len = tl.load(seq_info_ptr + seg * 4 + 1)
    column = tl.load(seq_info_ptr + seg * 4 + 2)
    kv_end = tl.load(seq_info_ptr + seg * 4 + 3)
    offs_m = tl.arange(0, BLOCK_M)
    qi = qt * BLOCK_Q + offs_m // G  # query index inside the segment
    row_valid = (offs_m < BLOCK_Q * G) & (qi < q_len)
    return q_start, q_len, column, kv_end, qt, qi, offs_m % G, row_valid


@triton.jit
def _split_rows(lo_row, hi_row, kv_lo, kv_hi, split, NUM_SPLITS: tl.constexpr, TARGET: tl.constexpr,
                BLOCK_N: tl.constexpr):
    # each row's piece [r_lo, r_hi) of its keys [lo_row, hi_row] in this split
    if TARGET > 0:  # planned: BLOCK_N << d keys a piece, d the doublings past TARGET pieces; pieces at multiples of it
        n = hi_row - lo_row + 1
        doublings = n * 0
        for i in tl.static_range(MAX_DOUBLINGS):
            doublings += (n > (BLOCK_N * TARGET) << i).to(tl.int32)
        width = (doublings * 0 + BLOCK_N) << doublings
        start = lo_row // width * width + split * width
    else:  # forced: the tile's keys cut evenly
        width = tl.cdiv(tl.cdiv(tl.maximum(kv_hi - kv_lo, 0), NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = lo_row * 0 + kv_lo + split * width
    return tl.maximum(start, lo_row), tl.minimum(start + width, hi_row + 1)


@triton.jit
def _sdpa_varlen_fwd(
    Q, K, V, SeqInfo, Out, OPart, LsePart, Sinks,
    stride_qt, stride_qh,
    stride_kr, stride_kc, stride_kh,
    stride_vr, stride_vc, stride_vh,
    stride_ot, stride_oh,
    stride_ps, stride_pt, stride_ph,
    stride_ls, stride_lt, stride_lh,
    q_tiles, rows, window, qk_scale, cap_log2,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, RING: tl.constexpr,
    NUM_SPLITS: tl.constexpr, TARGET: tl.constexpr, DOT_FP32: tl.constexpr, IEEE: tl.constexpr,
    SOFTCAP: tl.constexpr, SINKS: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous(PDL)
    pid_sq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q_start, q_len, column, kv_end, qt, qi, hg, row_valid = _tile_rows(
        SeqInfo, pid_sq, q_tiles, G, BLOCK_Q, BLOCK_M
    )
    head = kvh * G + hg
    qpos = kv_end - q_len + qi  # absolute position of each row's query
    offs_d = tl.arange(0, BLOCK_D)  # the head dim padded to a power of two; lanes past it load zeros
    d_ok = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)

    # -- the tile's kv range [kv_lo, kv_hi): union of its rows' masks
    first_q = qt * BLOCK_Q
    last_q = tl.minimum(first_q + BLOCK_Q, q_len) - 1
    if CAUSAL:
        kv_hi = kv_end - q_len + last_q + 1
    else:
        kv_hi = kv_end
    if WINDOWED:
        kv_lo = tl.maximum(kv_end - q_len + first_q - window + 1, 0)
    else:
        kv_lo = kv_end * 0
    kv_hi = tl.where(first_q < q_len, kv_hi, kv_lo)  # tiles past q_len do nothing

    # -- per-row key bounds (inclusive)
    if WINDOWED:
        lo_row = tl.maximum(qpos - window + 1, 0)
    else:
        lo_row = qpos * 0
    if CAUSAL:
        hi_row = qpos
    else:
        hi_row = qpos * 0 + kv_end - 1
    r_lo, r_hi = _split_rows(lo_row, hi_row, kv_lo, kv_hi, split, NUM_SPLITS, TARGET, BLOCK_N)
    busy = row_valid & (r_lo < r_hi)
    t_lo = tl.min(tl.where(busy, r_lo, kv_hi), 0)  # this program's keys: the union of its rows' pieces
    t_hi = tl.max(tl.where(busy, r_hi, 0), 0)  # 0 where no row has keys here: no tile, not one masked tile

    q_ptrs = Q + (q_start + qi)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    k_base = K + column.to(tl.int64) * stride_kc + kvh * stride_kh
    v_base = V + column.to(tl.int64) * stride_vc + kvh * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(t_lo // BLOCK_N * BLOCK_N, t_hi, BLOCK_N):  # tiles at fixed positions, as the row alone
        # -- load a K/V tile; ring storage keeps position p at row p % rows
        pos = start + offs_n
        pos_valid = (pos >= t_lo) & (pos < t_hi)
        if RING:
            r = (pos % rows).to(tl.int64)
        else:
            r = pos.to(tl.int64)
        kT = tl.load(k_base + r[None, :] * stride_kr + offs_d[:, None], mask=pos_valid[None, :] & d_ok[:, None],
                     other=0.0)
        v = tl.load(v_base + r[:, None] * stride_vr + offs_d[None, :], mask=pos_valid[:, None] & d_ok[None, :],
                    other=0.0)
        if DOT_FP32:
            kT = kT.to(tl.float32)
            v = v.to(tl.float32)
        # -- scores in the log2 domain, masked
        if IEEE:
            s = tl.dot(q, kT, input_precision="ieee")
        else:
            s = tl.dot(q, kT)
        if SOFTCAP:  # cap · tanh(x / cap) in the log2 domain: qk_scale is scale / cap, cap_log2 cap · log2(e)
            s = cap_log2 * (1.0 - 2.0 / (tl.exp2(s * (qk_scale * 2.0 * LOG2E_C)) + 1.0))
        else:
            s = s * qk_scale
        keep = (pos[None, :] >= r_lo[:, None]) & (pos[None, :] < r_hi[:, None])
        s = tl.where(keep, s, float("-inf"))
        # -- update m_i and l_i (a row with no key yet keeps m = -inf; use 0 as its pivot)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_pivot = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_pivot)
        p = tl.exp2(s - m_pivot[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # -- update the accumulator
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # -- write the output, or this split's normalised partial and its log2-sum-exp
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    t = q_start + qi
    if NUM_SPLITS == 1:
        if SINKS:  # the head's sink joins the sum (acc and l_i are relative to the pivot): gpt-oss
            pivot = tl.where(m_i == float("-inf"), 0.0, m_i)
            sink = tl.load(Sinks + head, mask=row_valid, other=0.0) * LOG2E_C
            o = acc / (l_i + tl.exp2(sink - pivot))[:, None]
        o_ptrs = Out + t[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=row_valid[:, None] & d_ok[None, :])
    else:
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
        p_ptrs = OPart + split * stride_ps + t[:, None] * stride_pt + head[:, None] * stride_ph + offs_d[None, :]
        tl.store(p_ptrs, o, mask=row_valid[:, None] & d_ok[None, :])
        tl.store(LsePart + split * stride_ls + t * stride_lt + head * stride_lh, lse, mask=row_valid)


@triton.jit
def _sdpa_varlen_merge(
    SeqInfo, Out, OPart, LsePart, Sinks,
    stride_ot, stride_oh,
    stride_ps, stride_pt, stride_ph,
    stride_ls, stride_lt, stride_lh,
    num_segments, D,
    BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, SEGS_P2: tl.constexpr, SINKS: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous(PDL)
    # One program per (packed row, head, d-block), the splits taken in order: a split with no keys adds exact
    # zeros, so a row merges to the same bits however many splits its step has.
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    # -- is row t covered by a segment? (rows no segment covers are written as zeros)
    offs_s = tl.arange(0, SEGS_P2)
    seg_ok = offs_s < num_segments
    q_start = tl.load(SeqInfo + offs_s * 4 + 0, mask=seg_ok, other=0)
    q_len = tl.load(SeqInfo + offs_s * 4 + 1, mask=seg_ok, other=0)
    n_cover = tl.sum(((t >= q_start) & (t < q_start + q_len)).to(tl.int32), 0)
    # -- weigh each split's normalised partial by 2^(lse - max lse)
    covered = n_cover > 0
    o_ok = d_ok & (offs_d * 0 + n_cover > 0)  # broadcast first: the interpreter rejects scalar & vector masks
    m = tl.full([], float("-inf"), tl.float32)
    for sp in range(NUM_SPLITS):
        lse = tl.load(LsePart + sp * stride_ls + t * stride_lt + h * stride_lh, mask=covered, other=float("-inf"))
        m = tl.maximum(m, lse)
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    l_sum = tl.zeros([], dtype=tl.float32)
    for sp in range(NUM_SPLITS):
        lse = tl.load(LsePart + sp * stride_ls + t * stride_lt + h * stride_lh, mask=covered, other=float("-inf"))
        w = tl.exp2(lse - m)
        o = tl.load(OPart + sp * stride_ps + t * stride_pt + h * stride_ph + offs_d, mask=o_ok, other=0.0)
        acc += w * o
        l_sum += w
    if SINKS:  # the head's sink joins the sum only (gpt-oss)
        l_sum += tl.exp2(tl.load(Sinks + h) * LOG2E_C - m)
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)
    tl.store(Out + t * stride_ot + h * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_ok)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def plan_tiles(*, G: int, max_q_len: int, head_dim: int, interpret: bool) -> tuple[int, int, int]:
    """(BLOCK_Q, BLOCK_M, BLOCK_N) from host ints only."""
    max_rows = 64 if head_dim >= 256 else 128  # M rows of a tile: registers hold (M, D) fp32
    if interpret:
        max_rows = 32
    block_q = max(1, min(_next_pow2(max(max_q_len, 1)), max(1, max_rows // G)))
    block_m = max(16, _next_pow2(block_q * G))  # tl.dot wants M >= 16
    block_n = 16 if interpret else (64 if head_dim >= 256 else 128)
    return block_q, block_m, block_n


def split_target(device: torch.device) -> int:
    """A row's splits before their width doubles (see TARGET_SPLITS)."""
    return TARGET_SPLITS if device.type == "cuda" else INTERPRET_TARGET_SPLITS


def plan_splits(*, span: int, block_n: int, windowed: bool, device: torch.device) -> int:
    """Enough splits for any row of at most `span` keys: one a tile up to the target, then the target (plus one where
    a window's first piece starts mid-width); a shorter row leaves its last ones empty."""
    return max(1, min(split_target(device), math.ceil(span / block_n)) + int(windowed))


def sdpa_varlen_triton(
    q: torch.Tensor,  # (T, H, D)
    k_cache: torch.Tensor,  # (rows, C, Hkv, D)
    v_cache: torch.Tensor,  # (rows, C, Hkv, D)
    seq_info: torch.Tensor,  # (S, 4) int32: q_start, q_len, column, kv_end
    *,
    scale: float,
    max_q_len: int,
    max_kv_len: int,
    causal: bool = True,
    window: int | None = None,
    rows_are_ring: bool | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,  # (H,) fp32
) -> torch.Tensor:  # (T, H, D), q's dtype
    T, H, D = q.shape
    rows, C, Hkv, Dk = k_cache.shape
    S = seq_info.shape[0]
    assert v_cache.shape == k_cache.shape and Dk == D, (q.shape, k_cache.shape, v_cache.shape)
    assert H % Hkv == 0, "query heads must be a multiple of KV heads"
    assert 1 <= D <= 256, "head dim must be at most 256"
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1, "head dim must be contiguous"
    assert k_cache.dtype == v_cache.dtype == q.dtype, (q.dtype, k_cache.dtype, v_cache.dtype)
    assert seq_info.dtype == torch.int32 and seq_info.shape == (S, 4) and seq_info.is_contiguous()
    assert q.device == k_cache.device == v_cache.device == seq_info.device
    assert max_q_len >= 0 and max_kv_len >= 0
    assert sinks is None or (sinks.shape == (H,) and sinks.dtype == torch.float32 and sinks.device == q.device)
    G = H // Hkv
    interpret = q.device.type == "cpu"
    windowed = bool(window)
    ring = windowed if rows_are_ring is None else rows_are_ring

    block_q, block_m, bn = plan_tiles(G=G, max_q_len=max_q_len, head_dim=D, interpret=interpret)
    q_tiles = max(1, triton.cdiv(max(max_q_len, 1), block_q))
    span = min(max_kv_len, window + max_q_len - 1) if windowed else max_kv_len
    bn = block_n or bn  # one tile width per model, whatever the step (a row's sums in one order)
    splits = num_splits or plan_splits(span=span, block_n=bn, windowed=windowed, device=q.device)
    if S == 0 or T == 0 or max_q_len == 0:
        return torch.zeros_like(q)
    if splits > 1:
        out = torch.empty_like(q)  # the merge writes every row, zeros where uncovered
        o_part = torch.empty(splits, T, H, D, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(splits, T, H, dtype=torch.float32, device=q.device)
    else:
        out = torch.zeros_like(q)  # rows no segment covers stay zero
        o_part = lse_part = out  # unused; any tensor keeps the signature

    warps = num_warps or (4 if block_m * D <= 16 * 256 else 8)
    stages = num_stages or 2
    grid = (S * q_tiles, Hkv, splits)
    sink_ptr = sinks if sinks is not None else lse_part  # any tensor keeps the signature
    _sdpa_varlen_fwd[grid](
        q, k_cache, v_cache, seq_info, out, o_part, lse_part, sink_ptr,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse_part.stride(0), lse_part.stride(1), lse_part.stride(2),
        q_tiles, rows, window or 0, scale / softcap if softcap else scale * LOG2E, softcap * LOG2E,
        G=G, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=bn,
        CAUSAL=causal, WINDOWED=windowed, RING=ring, NUM_SPLITS=splits, TARGET=0 if num_splits else split_target(q.device),
        DOT_FP32=interpret and q.dtype == torch.bfloat16, IEEE=q.dtype == torch.float32, SOFTCAP=bool(softcap),
        SINKS=sinks is not None, num_warps=warps, num_stages=stages, **launch_options(q),
    )
    if splits > 1:
        block_d = min(triton.next_power_of_2(D), 128)
        _sdpa_varlen_merge[(T, H, triton.cdiv(D, block_d))](
            seq_info, out, o_part, lse_part, sink_ptr,
            out.stride(0), out.stride(1),
            o_part.stride(0), o_part.stride(1), o_part.stride(2),
            lse_part.stride(0), lse_part.stride(1), lse_part.stride(2),
            S, D,
            BLOCK_D=block_d, NUM_SPLITS=splits,
            SEGS_P2=triton.next_power_of_2(S), SINKS=sinks is not None, num_warps=4, **launch_options(q),
        )
    return out
