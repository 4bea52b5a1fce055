"""Triton products of a mixture of experts' chosen experts for decode-sized steps, the routing read on the device.

Every expert of a layer is stacked in one tensor per buffer (engine/models/moe.py `StackedExperts`), in the layouts of
kernels/quant_linear_triton.py (int4 or fp4 words and pairs, int8 codes and row scales) or bf16. One program owns a BLOCK_N
slice of one tile's output: one (row, expert) pair in row 0 of a 16-row dot, or (GROUPED) up to 16 pairs of one expert
side by side, so that a step of many sessions reads an expert once per 16 rows that chose it, not once per row. It
reads the tile's expert (and, grouped, its pairs) on the device: no host sync and no per-expert launch, and a step
replays as a CUDA graph. Every row goes through the same 16-row dots as the dense decode kernels (its own row of the
MMA, the other rows masked or other pairs), so a row's result never depends on the other pairs of its step, nor on
whether they were grouped.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.quant_linear_triton import _chunk_codes, _chunk_dots_at, _slice_dot


@triton.jit
def _tile(t, ORDER, STARTS, E, XDIV, GROUPED: tl.constexpr):
    # (pairs, mask, x rows, expert, count) of tile t: GROUPED, up to 16 pairs of one expert, order[starts[t]:starts[t + 1]]
    # (none for an unused tile); else pair t alone, in row 0
    r = tl.arange(0, 16)
    if GROUPED:
        start = tl.load(STARTS + t)
        count = tl.load(STARTS + t + 1) - start
        ok = r < count
        pair = tl.load(ORDER + start + r, mask=ok, other=0)
        e = tl.load(E + start, mask=count > 0, other=0)
    else:
        count = 1
        ok = r < 1
        pair = t + r * 0
        e = tl.load(E + t)
    return pair, ok, (pair // XDIV).to(tl.int64), e.to(tl.int64), count


@triton.jit
def _store_pairs(Y, pair, ok, offs_n, n_ok, acc, stride_ym):
    tl.store(Y + pair.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty),
             mask=ok[:, None] & n_ok[None, :])


@triton.jit
def _int4_experts(X, Q, P, E, ORDER, STARTS, Y, N, K, KP, XDIV, stride_xm, stride_qe, stride_qn, stride_pe, stride_pn,
                  stride_ym, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, DOT_FP32: tl.constexpr, ASM: tl.constexpr,
                  TILE: tl.constexpr, GROUPED: tl.constexpr, FP4: tl.constexpr):
    # tile t = program_id(1): its pairs' x rows (pair // XDIV) against their expert's int4 matrix, to their Y rows
    pair, ok, xrow, e, count = _tile(tl.program_id(1), ORDER, STARTS, E, XDIV, GROUPED)
    if count > 0:
        Q += e * stride_qe
        P += e * stride_pe
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        dt: tl.constexpr = X.dtype.element_ty
        acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
        for c0 in range(0, KP // 128, CHUNKS):
            for c in tl.static_range(CHUNKS):
                chunk = c0 + c
                w0, w1, w2, w3, w4, w5, w6, w7 = _chunk_codes(Q, P, offs_n, n_ok, chunk, stride_qn, stride_pn, dt,
                                                              ASM, TILE, FP4)
                acc = _chunk_dots_at(X, xrow, ok, chunk * 128 + tl.arange(0, 16), K, stride_xm, w0, w1, w2, w3, w4,
                                     w5, w6, w7, acc, DOT_FP32)
        _store_pairs(Y, pair, ok, offs_n, n_ok, acc, stride_ym)


@triton.jit
def _rows_experts(X, C, S, E, ORDER, STARTS, Y, N, K, XDIV, stride_xm, stride_ce, stride_cn, stride_se, stride_ym,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr, SCALED: tl.constexpr,
                  GROUPED: tl.constexpr):
    # tile t: its pairs' x rows against their expert's int8 rows (times their scales) or bf16 matrix (SCALED False)
    pair, ok, xrow, e, count = _tile(tl.program_id(1), ORDER, STARTS, E, XDIV, GROUPED)
    if count > 0:
        C += e * stride_ce
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        n_ok = offs_n < N
        dt = X.dtype.element_ty
        acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            w = tl.load(C + offs_n[:, None] * stride_cn + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0)
            acc = _slice_dot(X, xrow, ok, k, K, stride_xm, w.to(dt), acc, DOT_FP32)
        if SCALED:
            acc = acc * tl.load(S + e * stride_se + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        _store_pairs(Y, pair, ok, offs_n, n_ok, acc, stride_ym)


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _pair_tiles(EXP, ORDER, SORTED, STARTS, P, TILES, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                TBLOCK: tl.constexpr):
    # one program: pair i's place in the order by (expert, i) is how many pairs come before it (compared CHUNK at a
    # time), so ORDER and SORTED fill without a sort; then STARTS[t] the first sorted pair of tile t, a tile every 16
    # pairs of an expert and at each new expert; STARTS[T..TILES] = P (no pairs: tile T's end, and unused tiles)
    i = tl.arange(0, BLOCK)
    ok = i < P
    e = tl.load(EXP + i, mask=ok, other=0).to(tl.int32)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    for j0 in range(0, P, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        ej = tl.load(EXP + j, mask=j < P, other=0).to(tl.int32)
        ahead = (j < P)[None, :] & ((ej[None, :] < e[:, None]) | ((ej[None, :] == e[:, None]) & (j[None, :] < i[:, None])))
        rank += tl.sum(ahead.to(tl.int32), 1)
    tl.store(ORDER + rank, i, mask=ok)
    tl.store(SORTED + rank, e, mask=ok)
    tl.debug_barrier()  # the sorted experts, written by every thread, read back in order
    s = tl.load(SORTED + i, mask=ok, other=-1)
    prev = tl.load(SORTED + i - 1, mask=ok & (i > 0), other=-1)
    first = tl.associative_scan(tl.where(ok & ((i == 0) | (s != prev)), i, 0), 0, _larger)  # its expert's first pair
    opens = ok & ((i - first) % 16 == 0)
    tl.store(STARTS + tl.cumsum(opens.to(tl.int32), 0) - 1, i, mask=opens)
    count = tl.sum(opens.to(tl.int32), 0)
    t = tl.arange(0, TBLOCK)
    tl.store(STARTS + t, P + t * 0, mask=(t >= count) & (t <= TILES))


@triton.jit
def _weighted_rows(Y, W, O, H, KTOP: tl.constexpr, BLOCK_H: tl.constexpr):
    # O[t] = Σ_j W[t, j] · Y[t·KTOP + j] in fp32, j in order: a row's experts summed the same way in every step
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = offs < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(KTOP):
        w = tl.load(W + t * KTOP + j)
        acc += tl.load(Y + (t * KTOP + j) * H + offs, mask=ok, other=0.0).to(tl.float32) * w
    tl.store(O + t * H + offs, acc.to(O.dtype.element_ty), mask=ok)
