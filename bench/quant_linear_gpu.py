"""The quantized decode GEMMs alone on one GPU: each 8B / 270M decode matrix as int4 (and int8) against the bf16
Triton skinny GEMM, per row count, with a sweep of tile shapes. Prints JSON lines: shape, rows, kind, config, us,
gb_s (weight bytes over time), speedup_vs_bf16.

    python -m bench.quant_linear_gpu --rows 1 8 64 [--sweep] [--int8] [--fp4]
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch

from bench.attention_bench import time_graph
from engine.quant.weight import TILE_ROWS
from kernels.quant_linear import int4_tiled
from kernels.quant_linear_triton import int4_linear_triton, int8_linear_triton
from kernels.skinny_linear_triton import skinny_linear_triton

MATRICES = {  # name: (N, K)
    "8b.qkv": (6144, 4096), "8b.v": (1024, 4096), "8b.o": (4096, 4096), "8b.gate_up": (28672, 4096),
    "8b.down": (4096, 14336), "8b.head": (128256, 4096), "1b.qkv": (3072, 2048), "1b.o": (2048, 2048),
    "1b.gate_up": (16384, 2048), "1b.down": (2048, 8192), "270m.qkv": (1536, 640), "270m.o": (640, 1024),
    "270m.gate_up": (4096, 640), "270m.down": (640, 2048), "270m.head": (262144, 640),
    "oss.expert_gate_up": (5760, 2880), "oss.expert_down": (2880, 2880),  # one gpt-oss-20b expert
}


def _layout(q4: list, config: dict) -> list:
    """The int4 weights in the layout `config` asks for: tiled (`tile` rows of a chunk together, the engine's) or, with
    tile 1, row-major."""
    t = config.get("tile", TILE_ROWS)
    return q4 if t == 1 else [int4_tiled(w, p, t) for w, p in q4]


def _kernel_args(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "tile"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--sweep", action="store_true", help="try tile shapes (block_n, warps, stages) of --kernel")
    ap.add_argument("--matrices", nargs="+", default=list(MATRICES))
    ap.add_argument("--int8", action="store_true", help="also the int8-row kernel")
    ap.add_argument("--fp4", action="store_true", help="also MXFP4's 4-bit floats in int4's words (the same kernel)")
    ap.add_argument("--splits", type=int, nargs="+", default=[1],
                    help="K slices tried (fp32 partials a consumer sums; the sum is not timed)")
    ap.add_argument("--narrow-sweep", action="store_true", help="a smaller sweep: block_n 32-128, stages 3-4")
    ap.add_argument("--configs", type=json.loads, default=None,
                    help='the tiles tried, a JSON list ({} = the default): \'[{}, {"block_n": 128, "chunks": 1}]\'; '
                         '"tile": 1 is the row-major int4 layout')
    ap.add_argument("--kernel", choices=("int4", "int8"), default="int4", help="the kernel --configs and --sweep tile")
    opts = ap.parse_args()
    dev = torch.device("cuda")
    configs = opts.configs or [dict()]
    if opts.sweep or opts.narrow_sweep:
        bns, stages = ([32, 64, 128], [3, 4]) if opts.narrow_sweep else ([16, 32, 64, 128, 256], [2, 3, 4])
        chunks = [{"chunks": 1}, {"chunks": 2}] if opts.kernel == "int4" else [{}]  # chunks a loop step: int4's only
        # 1-2 warps too: 64 columns a warp was the best one-row int4 tile, which sweeps of 4-8 warps never tried
        configs = [dict(block_n=bn, num_warps=w, num_stages=s) | c for bn, w, s, c in
                   itertools.product(bns, [1, 2, 4, 8], stages, chunks)]
    configs = [c | ({"splits": s} if s > 1 else {}) for c in configs for s in opts.splits]
    for name in opts.matrices:
        n, k = MATRICES[name]
        copies = max(2, min(18, (256 << 20) // (n * k)))  # more bytes than L2 holds, as in a step's chain of layers
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        kp = -(-k // 128) * 128  # K padded to whole chunks
        q4 = [(torch.randint(-2**31, 2**31 - 1, (n, kp // 8), dtype=torch.int32, device=dev),
               torch.full((n, kp // 128, 4), 0x3C003C00, dtype=torch.int32, device=dev)) for _ in range(copies)]
        fp4 = [(w, torch.full((n, kp // 128, 1), 0x7A7A7A7A, dtype=torch.int32, device=dev)) for w, _ in q4]
        q8 = [(torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev),
               torch.full((n,), 1e-3, device=dev, dtype=torch.bfloat16)) for _ in range(copies)]
        for m in opts.rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            base = time_graph([lambda w=w: skinny_linear_triton(x, w) for w in ws]) * 1e3
            row = {"matrix": name, "rows": m}
            print(json.dumps(row | {"kind": "bf16", "us": round(base, 2), "gb_s": round(2 * n * k / base / 1e3, 1)}))
            int4 = ("int4", lambda c: [lambda a=a: int4_linear_triton(x, *a, **_kernel_args(c))
                                              for a in _layout(q4, c)], n * k * 5 // 8)
            int8 = ("int8", lambda c: [lambda a=a: int8_linear_triton(x, *a, **c) for a in q8], n * k)
            mx = ("fp4", lambda c: [lambda a=a: int4_linear_triton(x, *a, **_kernel_args(c))
                                    for a in _layout(fp4, c)], n * k * 17 // 32)
            # tiles given or swept are one kernel's; with none, --int8 adds the int8 kernel's default beside int4's
            kinds = (int8,) if opts.kernel == "int8" else (int4, int8) if opts.int8 and len(configs) == 1 else (int4,)
            kinds += (mx,) if opts.fp4 else ()
            for kind, calls, nbytes in kinds:
                results = []
                for c in configs:
                    if c.get("chunks", 1) > 1 and (k // 128) % c["chunks"]:
                        continue
                    try:
                        results.append((time_graph(calls(c)) * 1e3, c))
                    except Exception as exc:  # a tile that does not fit shared memory: skip it
                        results.append((float("inf"), c | {"error": type(exc).__name__}))
                if opts.configs:  # each tile asked for
                    for us, c in results:
                        print(json.dumps(row | {"kind": kind, "config": c, "us": round(us, 2),
                                                "speedup_vs_bf16": round(base / us, 3)}), flush=True)
                    continue
                for split in sorted({c.get("splits", 1) for _, c in results}):  # the best tile per K split
                    us, c = min((r for r in results if r[1].get("splits", 1) == split), key=lambda r: r[0])
                    print(json.dumps(row | {"kind": kind, "config": c, "us": round(us, 2),
                                            "gb_s": round(nbytes / us / 1e3, 1), "speedup_vs_bf16": round(base / us, 3)}),
                          flush=True)

if __name__ == "__main__":
    main()
