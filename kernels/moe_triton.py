"""Triton products of a mixture of experts' chosen experts for decode-sized steps, the routing read on the device.

Every expert of a layer is stacked in one tensor per buffer (engine/models/moe.py `StackedExperts`), in the layouts of
kernels/quant_linear_triton.py (int4 words and pairs, int8 codes and row scales) or bf16. One program owns a BLOCK_N
slice of one (row, expert) pair's output: it reads the pair's expert from `E` on the device, so no host sync and no
per-expert launch, and a step replays as a CUDA graph. The pair's one row goes through the same 16-row dots as the
dense decode kernels (rows 1-15 masked), so a row's result never depends on the other pairs of its step.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.quant_linear_triton import _chunk_codes, _chunk_dots, _slice_dot, _store_rows


@triton.jit
def _int4_experts(X, Q, P, E, Y, N, K, KP, XDIV, stride_xm, stride_qe, stride_qn, stride_pe, stride_pn, stride_ym,
                  BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, DOT_FP32: tl.constexpr, ASM: tl.constexpr,
                  TILE: tl.constexpr):
    # pair p = program_id(1): x row p // XDIV against expert E[p]'s int4 matrix, to Y row p
    p = tl.program_id(1)
    e = tl.load(E + p).to(tl.int64)
    Q += e * stride_qe
    P += e * stride_pe
    X += (p // XDIV).to(tl.int64) * stride_xm
    rows = tl.arange(0, 16)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    dt: tl.constexpr = X.dtype.element_ty
    acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    for c0 in range(0, KP // 128, CHUNKS):
        for c in tl.static_range(CHUNKS):
            chunk = c0 + c
            w0, w1, w2, w3, w4, w5, w6, w7 = _chunk_codes(Q, P, offs_n, n_ok, chunk, stride_qn, stride_pn, dt, ASM,
                                                          TILE)
            acc = _chunk_dots(X, rows, 1, chunk * 128 + tl.arange(0, 16), K, stride_xm, w0, w1, w2, w3, w4, w5, w6,
                              w7, acc, DOT_FP32)
    _store_rows(Y + p.to(tl.int64) * stride_ym + offs_n[None, :], rows, 1, n_ok, acc, stride_ym)


@triton.jit
def _rows_experts(X, C, S, E, Y, N, K, XDIV, stride_xm, stride_ce, stride_cn, stride_se, stride_ym,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr, SCALED: tl.constexpr):
    # pair p: x row p // XDIV against expert E[p]'s int8 rows (times their scales) or bf16 matrix (SCALED False)
    p = tl.program_id(1)
    e = tl.load(E + p).to(tl.int64)
    C += e * stride_ce
    X += (p // XDIV).to(tl.int64) * stride_xm
    rows = tl.arange(0, 16)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    dt = X.dtype.element_ty
    acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        w = tl.load(C + offs_n[:, None] * stride_cn + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0)
        acc = _slice_dot(X, rows, rows < 1, k, K, stride_xm, w.to(dt), acc, DOT_FP32)
    if SCALED:
        acc = acc * tl.load(S + e * stride_se + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    _store_rows(Y + p.to(tl.int64) * stride_ym + offs_n[None, :], rows, 1, n_ok, acc, stride_ym)


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
