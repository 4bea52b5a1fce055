"""How fast can a Triton kernel stream a decode GEMM's int4 bytes on this GPU, against the int4 kernel itself?

The 8B gate/up (28,672 × 4,096: 58.7 MB of words and 7.3 MB of (scale, zero) pairs, four copies so L2 holds none):
the engine's int4 decode GEMM at one row; the same kernel's loads alone (its grid, its tiled chunk loads, the
values only xor-ed so they are kept) over tile shapes; and a flat streaming read of the same bytes over block sizes,
program counts, warps and stages. The gap between the loads and the whole kernel is its dequantization and dots;
the flat stream is what a Triton kernel reads at best here. Prints JSON lines: probe, us, tb_s, and the shape tried.

    python -m bench.stream_ceiling_gpu
"""
from __future__ import annotations

import itertools
import json

import torch
import triton
import triton.language as tl

from bench.attention_bench import time_graph
from kernels.quant_linear import int4_tiled
from kernels.quant_linear_triton import int4_linear_triton


@triton.jit
def _loads_only(Q, P, Y, N, KP, CS, stride_qn, stride_pn, BLOCK_N: tl.constexpr, TILE: tl.constexpr):
    # the int4 kernel's grid and chunk loads (tiled layout), nothing else
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    group, r = (offs_n // TILE)[:, None], (offs_n % TILE)[:, None]
    acc = tl.zeros([BLOCK_N, 16], dtype=tl.int32)
    acc_p = tl.zeros([BLOCK_N, 4], dtype=tl.int32)
    c_lo = tl.program_id(1) * CS
    for chunk in range(c_lo, tl.minimum(KP // 128, c_lo + CS)):
        acc ^= tl.load(Q + group * stride_qn + chunk * (16 * TILE) + r * 16 + tl.arange(0, 16)[None, :],
                       mask=n_ok[:, None], other=0)
        acc_p ^= tl.load(P + group * stride_pn + chunk * (4 * TILE) + r * 4 + tl.arange(0, 4)[None, :],
                         mask=n_ok[:, None], other=0)
    tl.store(Y + tl.program_id(1) * N + offs_n, tl.xor_sum(acc, 1) ^ tl.xor_sum(acc_p, 1), mask=n_ok)


@triton.jit
def _stream(X, Y, n, PER, BLOCK: tl.constexpr):
    # program p reads [p * PER, (p + 1) * PER) in BLOCK-wide loads
    start = tl.program_id(0) * PER
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for off in range(start, tl.minimum(start + PER, n), BLOCK):
        o = off + tl.arange(0, BLOCK)
        acc ^= tl.load(X + o, mask=o < n, other=0)
    tl.store(Y + tl.program_id(0), tl.xor_sum(acc, 0))


def main() -> None:
    dev = torch.device("cuda")
    n, k, copies = 28672, 4096, 4
    chunks = k // 128
    tiled = [int4_tiled(torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device=dev),
                        torch.full((n, chunks, 4), 0x3C003C00, dtype=torch.int32, device=dev), 16)
             for _ in range(copies)]
    nbytes = n * k // 2 + n * chunks * 16
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)

    def report(probe: str, us: float, **shape) -> None:
        print(json.dumps({"probe": probe, "us": round(us, 2), "tb_s": round(nbytes / us / 1e6, 2), **shape}),
              flush=True)

    report("int4_kernel_2splits", time_graph([lambda a=a: int4_linear_triton(x, *a, splits=2) for a in tiled]) * 1e3)
    report("int4_kernel_1split", time_graph([lambda a=a: int4_linear_triton(x, *a) for a in tiled]) * 1e3)
    for bn, splits, warps, stages in itertools.product([64, 128], [1, 2, 4], [4, 8], [2, 3, 4]):
        cs = chunks // splits
        y = torch.empty(splits, n, dtype=torch.int32, device=dev)

        def loads(a, bn=bn, cs=cs, warps=warps, stages=stages, y=y):
            words, pairs = a[0].view(n, chunks * 16), a[1].view(n, chunks, 4)
            _loads_only[(triton.cdiv(n, bn), chunks // cs)](words, pairs, y, n, k, cs, words.stride(0) * 16,
                                                            pairs.stride(0) * 16, BLOCK_N=bn, TILE=16,
                                                            num_warps=warps, num_stages=stages)
        report("loads_only", time_graph([lambda a=a: loads(a) for a in tiled]) * 1e3, bn=bn, splits=splits,
               warps=warps, stages=stages)
    flats = [torch.cat([a[0].flatten(), a[1].flatten()]) for a in tiled]
    total = flats[0].numel()
    for block, programs, warps, stages in itertools.product([1024, 2048, 4096], [264, 528, 1056, 2112], [4, 8],
                                                            [2, 3, 4]):
        per = triton.cdiv(triton.cdiv(total, programs), block) * block
        grid = triton.cdiv(total, per)
        y = torch.empty(grid, dtype=torch.int32, device=dev)
        calls = [lambda f=f: _stream[(grid,)](f, y, total, per, BLOCK=block, num_warps=warps, num_stages=stages)
                 for f in flats]
        report("stream", time_graph(calls) * 1e3, block=block, programs=grid, warps=warps, stages=stages)
    report("torch_sum_bf16", time_graph([lambda f=f: f.view(torch.bfloat16).sum() for f in flats]) * 1e3)


if __name__ == "__main__":
    main()
