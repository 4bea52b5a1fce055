"""A probe: the int4 decode GEMM with its tensor-core instruction written out, against the engine's int4 kernel.

The engine's int4 kernel (kernels/quant_linear_triton.py) hands dequantized (BLOCK_N, 16) slices to `tl.dot`, which
moves them, and a 16 × 16 activation tile per slice, through shared memory into the MMA's operand layout. This
kernel skips that: every tensor is (J, 8, 16) in Triton's default blocked layout, where lane 4g + q of the (one)
warp holds, for row pass j, words 4q .. 4q + 3 of weight row 8j + g of a chunk, which is the B operand of an
m16n8k16 `mma.sync` once the K order fits it: step (p, h) of a chunk (nibble pair p < 4, word pair h < 2) takes from
lane (g, q) words 4q + 2h and 4q + 2h + 1, nibbles p and p + 4, and the activations are loaded in that order. The
words, pairs and activations stream through `tl.range(num_stages=...)` (cp.async); the dequantization is the engine's
bf16x2 PTX. One warp a program only: with more, Triton gives the loads another layout on the H200 and the lanes no
longer hold the fragments (wrong results, caught by the check below). A row's bits do not depend on the step's rows.

Measured (docs/QUANTIZED.md, docs/bench/h200-int4-direct-mma.jsonl): correct, and slower than the engine's kernel.
Prints JSON lines: the check (relative error against the dequantized product, bits across row counts), then per
matrix and rows the engine's kernel, bf16, and each tile (row passes, warps, stages, K slices).

    python -m bench.int4_direct_mma_gpu [--matrices 8b.gate_up 8b.down] [--rows 1 16 64]
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton
import triton.language as tl

from bench.attention_bench import time_graph
from bench.quant_linear_gpu import MATRICES
from kernels.pdl import launch_options, wait_for_previous
from kernels.quant_linear import int4_tiled
from kernels.quant_linear_triton import (_result, _rows, _slice_chunks, _slice_step, int4_dequantize_triton,
                                         int4_layout, int4_linear_triton, int4_splits)
from kernels.skinny_linear_triton import skinny_linear_triton

# One MMA step pair over nibble pair p of four words: $0-3 the accumulators out, $4-7 the words (shifted right by 4p),
# $8-11 the chunk's pairs (s0|s2, s1|s3, z0|z2, z1|z3), $12-15 activation pairs of rows g, $16-19 of rows g + 8 (element
# e: (x[16p + 4q + e], x[16p + 64 + 4q + e])), $20-23 the accumulators in. Dequantizing: (w & 0x000f000f) | 0x43004300 is
# the bf16 pair (128 + code p, 128 + code p + 4); minus 136 is (code - 8), exact; one bf16x2 FMA applies (scale, zero).
_DEQUANT = """
lop3.b32 q, ${w}, 0x000f000f, 0x43004300, 0xea;
fma.rn.bf16x2 t, q, one, m136;
fma.rn.bf16x2 b{w4}, t, ${{s}}, ${{z}};"""
_MMA_STEPS = ("{{\n.reg .b32 q, t, m136, one, b0, b1, b2, b3;\nmov.b32 m136, 0xC308C308;\nmov.b32 one, 0x3F803F80;"
              + "".join(_DEQUANT.format(w=4 + i, w4=i) for i in range(4)) + """
mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{$0, $1, $2, $3}}, {{$12, $16, $13, $17}}, {{b0, b1}}, {{$20, $21, $22, $23}};
mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{$0, $1, $2, $3}}, {{$14, $18, $15, $19}}, {{b2, b3}}, {{$0, $1, $2, $3}};
}}
""")
MMA_GROUPS_02 = tl.constexpr(_MMA_STEPS.format(s=8, z=10))  # nibble pairs 0, 1: groups 0 and 2
MMA_GROUPS_13 = tl.constexpr(_MMA_STEPS.format(s=9, z=11))  # nibble pairs 2, 3: groups 1 and 3


@triton.jit
def _mma_pair(words, pairs, xg, xg8, acc, P: tl.constexpr):
    # acc += the two MMA steps of nibble pair P over one chunk's words (each lane: one row pass's four words)
    w = words >> (4 * P)
    if P < 2:
        return tl.inline_asm_elementwise(MMA_GROUPS_02, "=r,=r,=r,=r" + ",r" * 20, [w, pairs, xg, xg8, acc],
                                         dtype=tl.float32, is_pure=True, pack=4)
    return tl.inline_asm_elementwise(MMA_GROUPS_13, "=r,=r,=r,=r" + ",r" * 20, [w, pairs, xg, xg8, acc],
                                     dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _x_pairs(X, m, M, k0, K, stride_xm, kq, P: tl.constexpr):
    # (1, 8, 16) int32: element (0, g, 4q + e) the bf16 pair (x[m, k0 + 16P + 4q + e], x[m, k0 + 16P + 64 + 4q + e])
    ok = m < M
    lo_k = k0 + 16 * P + kq
    lo = tl.load(X + m * stride_xm + lo_k, mask=ok & (lo_k < K), other=0.0)
    hi = tl.load(X + m * stride_xm + lo_k + 64, mask=ok & (lo_k + 64 < K), other=0.0)
    lo = lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi = hi.to(tl.int16, bitcast=True).to(tl.int32) << 16
    return lo | hi


@triton.jit
def _tile_chunk(X, t: tl.constexpr, M, k0, K, stride_xm, kq, g, words, pairs, acc):
    # acc (rows 16t .. 16t + 15) += this chunk's four nibble pairs
    m = 16 * t + g
    for p in tl.static_range(4):
        xg = _x_pairs(X, m, M, k0, K, stride_xm, kq, p)
        xg8 = _x_pairs(X, m + 8, M, k0, K, stride_xm, kq, p)
        acc = _mma_pair(words, pairs, xg, xg8, acc, p)
    return acc


@triton.jit
def _store_acc(Y, t: tl.constexpr, g, c, cols, n_ok, M, stride_ym, acc):
    # lane (g, q)'s accumulator e is row g + 8 (e // 2), column 2q + e % 2 of its row pass's eight
    m = 16 * t + g + 8 * ((c % 4) // 2)
    tl.store(Y + m * stride_ym + cols, acc, mask=(m < M) & n_ok)


@triton.jit
def _int4_mma_linear(
    X, Q, P, Y, M, N, K, KP, CS,
    stride_xm, stride_qn, stride_pn, stride_ym, stride_ys,
    BLOCK_M: tl.constexpr, J: tl.constexpr, TILE: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
):
    # program (n, s): columns [8 J n, 8 J (n + 1)), chunks [s CS, (s + 1) CS), fp32 partials to Y[s]
    wait_for_previous(PDL)
    j = tl.arange(0, J)[:, None, None]
    g = tl.arange(0, 8)[None, :, None]
    c = tl.arange(0, 16)[None, None, :]
    # = c, written so that the loads' contiguity is four (one lane's elements): with one warp the (1, 8, 16) activation
    # loads then take the words' layout, and broadcast over the row passes for free
    kq = 4 * (c // 4) + c % 4
    n = tl.program_id(0) * (8 * J) + 8 * j + g
    w_ok = n < N
    grp, r = n // TILE, n % TILE
    q_at = Q + grp * stride_qn + r * 16 + c
    p_at = P + grp * stride_pn + r * 4 + c % 4
    acc0 = tl.zeros([J, 8, 16], dtype=tl.float32)
    acc1 = tl.zeros([J, 8, 16], dtype=tl.float32)
    acc2 = tl.zeros([J, 8, 16], dtype=tl.float32)
    acc3 = tl.zeros([J, 8, 16], dtype=tl.float32)
    c_lo = tl.program_id(1) * CS
    for chunk in tl.range(c_lo, tl.minimum(KP // 128, c_lo + CS), num_stages=STAGES):
        words = tl.load(q_at + chunk * (16 * TILE), mask=w_ok, other=0)
        pairs = tl.load(p_at + chunk * (4 * TILE), mask=w_ok, other=0)
        k0 = chunk * 128
        acc0 = _tile_chunk(X, 0, M, k0, K, stride_xm, kq, g, words, pairs, acc0)
        if BLOCK_M >= 32:
            acc1 = _tile_chunk(X, 1, M, k0, K, stride_xm, kq, g, words, pairs, acc1)
        if BLOCK_M >= 48:
            acc2 = _tile_chunk(X, 2, M, k0, K, stride_xm, kq, g, words, pairs, acc2)
        if BLOCK_M == 64:
            acc3 = _tile_chunk(X, 3, M, k0, K, stride_xm, kq, g, words, pairs, acc3)
    cols = tl.program_id(0) * (8 * J) + 8 * j + 2 * (c // 4) + c % 2
    n_ok = cols < N
    out = Y + tl.program_id(1) * stride_ys
    _store_acc(out, 0, g, c, cols, n_ok, M, stride_ym, acc0)
    if BLOCK_M >= 32:
        _store_acc(out, 1, g, c, cols, n_ok, M, stride_ym, acc1)
    if BLOCK_M >= 48:
        _store_acc(out, 2, g, c, cols, n_ok, M, stride_ym, acc2)
    if BLOCK_M == 64:
        _store_acc(out, 3, g, c, cols, n_ok, M, stride_ym, acc3)


def int4_mma_linear(x: torch.Tensor, words: torch.Tensor, pairs: torch.Tensor, *, splits: int = 1,
                    row_passes: int = 4, num_stages: int = 2) -> torch.Tensor:
    """x (M, K) bf16 @ Wᵀ for either int4 layout: (M, N) bf16, or with `splits` > 1 fp32 partials (S, M, N) over
    the engine kernel's K slices. A one-warp program owns 8 × `row_passes` columns."""
    M, K = x.shape
    words, pairs, tile = int4_layout(words, pairs)
    N, kp = words.shape[0], words.shape[1] * 8
    assert x.dtype == torch.bfloat16 and x.is_cuda and x.stride(1) == 1
    n_chunks = kp // 128
    cs = _slice_chunks(n_chunks, splits, _slice_step(N, n_chunks))
    s = triton.cdiv(n_chunks, cs)
    y = _result(None, (s, M, N) if splits > 1 else (M, N), torch.float32 if splits > 1 else x.dtype, x)
    _int4_mma_linear[(triton.cdiv(N, 8 * row_passes), s)](
        x, words, pairs, y, M, N, K, kp, cs, x.stride(0), words.stride(0) * tile, pairs.stride(0) * tile,
        y.stride(-2), y.stride(0) if splits > 1 else 0, BLOCK_M=_rows(x), J=row_passes, TILE=tile,
        STAGES=num_stages, num_warps=1, **launch_options(x),
    )
    return y


def _pairs(n: int, chunks: int, dev: torch.device) -> torch.Tensor:
    """Random bf16 scales and zeros packed as the int4 layout's (s0|s2, s1|s3, z0|z2, z1|z3)."""
    s = (torch.rand(n, chunks, 4, device=dev) * 0.02 + 0.001).to(torch.bfloat16).view(torch.int16).to(torch.int32)
    z = (torch.randn(n, chunks, 4, device=dev) * 0.01).to(torch.bfloat16).view(torch.int16).to(torch.int32)
    s, z = s & 0xFFFF, z & 0xFFFF
    return torch.stack([s[..., 0] | (s[..., 2] << 16), s[..., 1] | (s[..., 3] << 16),
                        z[..., 0] | (z[..., 2] << 16), z[..., 1] | (z[..., 3] << 16)], -1).contiguous()


def _words(n: int, k: int, dev: torch.device) -> torch.Tensor:
    return torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device=dev)


def check(name: str, dev: torch.device) -> None:
    n, k = MATRICES[name]
    w, p = _words(n, k, dev), _pairs(n, k // 128, dev)
    x = torch.randn(64, k, device=dev, dtype=torch.bfloat16)
    ref = x.float() @ int4_dequantize_triton(w, p, torch.bfloat16).float().t()
    tiled = int4_tiled(w, p, 16)
    outs = {m: int4_mma_linear(x[:m], *tiled, splits=4) for m in (1, 5, 16, 17, 64)}
    err = max(((y.sum(0) - ref[:m]).abs().max() / ref[:m].abs().max()).item() for m, y in outs.items())
    engine = max(((int4_linear_triton(x[:m], *tiled, splits=4).sum(0) - ref[:m]).abs().max()
                  / ref[:m].abs().max()).item() for m in outs)
    same = all(torch.equal(y[:, :1], outs[64][:, :1]) for y in outs.values()) \
        and torch.equal(outs[16], outs[64][:, :16]) and torch.equal(outs[5], outs[17][:, :5])
    print(json.dumps({"check": name, "rel_err": err, "engine_rel_err": engine, "bits_independent_of_rows": same,
                      "row_major_equal_tiled": torch.equal(int4_mma_linear(x[:16], w, p, splits=4), outs[16])}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--matrices", nargs="+", default=["8b.gate_up", "8b.down", "8b.qkv", "8b.o"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--row-passes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--splits", type=int, nargs="+", default=[2, 4, 8])
    opts = ap.parse_args()
    dev = torch.device("cuda")
    for name in opts.matrices:
        check(name, dev)
    for name in opts.matrices:
        n, k = MATRICES[name]
        copies = max(2, min(18, (256 << 20) // (n * k)))  # more bytes than L2 holds
        q4 = [int4_tiled(_words(n, k, dev), _pairs(n, k // 128, dev), 16) for _ in range(copies)]
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in opts.rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            row = {"matrix": name, "rows": m}
            bf16 = time_graph([lambda w=w: skinny_linear_triton(x, w) for w in ws]) * 1e3
            sp = int4_splits(n, k // 128, dev)
            engine = time_graph([lambda a=a: int4_linear_triton(x, *a, splits=sp) for a in q4]) * 1e3
            print(json.dumps(row | {"bf16_us": round(bf16, 2), "engine_int4_us": round(engine, 2), "splits": sp}))
            for j, stages, splits in itertools.product(opts.row_passes, opts.stages, opts.splits):
                if m * j > 256:  # registers: more row passes only at few rows
                    continue
                us = time_graph([lambda a=a: int4_mma_linear(x, *a, splits=splits, row_passes=j, num_stages=stages)
                                 for a in q4]) * 1e3
                print(json.dumps(row | {"row_passes": j, "stages": stages, "splits": splits, "us": round(us, 2),
                                        "vs_engine": round(engine / us, 3)}), flush=True)


if __name__ == "__main__":
    main()
