"""Decode GEMMs on CUDA: cuBLAS (F.linear) vs the Triton skinny GEMM, per call inside a CUDA graph.

Gemma-3-270M's decode GEMMs (fused qkv, fused gate/up, o, down) at 1, 8 and 64 rows, bf16. Each case
replays a graph of 18 calls over 18 different weight copies (one per layer, as in a step, so L2 holds
none of them). Prints JSON lines: shape, rows, microseconds per call for each, and the ratio; with
--sweep also the best Triton block/warp/stage setting per case; with --splits the split-K variant's
time per slice count (partials out; the consumer's summing is not in it).

With --lm-head: the tied LM head (262144 x 640) at 1, 8 and 64 rows, fp32 logits out, cuBLAS
(`torch.mm(..., out_dtype=float32)`) against the Triton GEMM's one-slice fp32 partials over block/stage
settings, each right after the residual add + norm that feeds it (with PDL the Triton head starts
pulling its weights while that kernel runs).

    python bench/linear_bench.py [--sweep] [--splits 2 4 8] [--shapes o down] [--lm-head] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.attention_bench import time_graph  # noqa: E402
from kernels.skinny_linear_triton import skinny_linear_triton  # noqa: E402

SHAPES = {"qkv": (1536, 640), "gate_up": (4096, 640), "o": (640, 1024), "down": (640, 2048)}
LAYERS = 18


def case(name: str, m: int, sweep: bool, splits: list[int]) -> dict:
    n, k = SHAPES[name]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(LAYERS)]
    cublas = time_graph([lambda w=w: F.linear(x, w) for w in ws]) * 1e3
    triton_us = time_graph([lambda w=w: skinny_linear_triton(x, w) for w in ws]) * 1e3
    err = (skinny_linear_triton(x, ws[0]).float() - F.linear(x, ws[0]).float()).abs().max().item()
    rec = {"gemm": name, "n": n, "k": k, "rows": m, "cublas_us": round(cublas, 2), "triton_us": round(triton_us, 2),
           "speedup": round(cublas / triton_us, 2), "max_abs_diff": err,
           "floor_us": round(n * k * 2 / 4.2e12 * 1e6, 2)}
    if splits:
        rec["split_k_us"] = {s: round(time_graph([lambda w=w: skinny_linear_triton(x, w, splits=s) for w in ws]) * 1e3, 2)
                             for s in splits}
    if sweep:
        best = None
        for bn in (16, 32):
            for bk in (64, 128, 256):
                for warps in (2, 4, 8):
                    for stages in (2, 3, 4):
                        try:
                            t = time_graph([lambda w=w: skinny_linear_triton(
                                x, w, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages) for w in ws]) * 1e3
                        except Exception:  # noqa: BLE001 - out of shared memory and the like
                            continue
                        if best is None or t < best[0]:
                            best = (t, bn, bk, warps, stages)
        if best:
            rec["best"] = {"us": round(best[0], 2), "block_n": best[1], "block_k": best[2], "num_warps": best[3],
                           "num_stages": best[4]}
    return rec


def lm_head_cases(rows: list[int]) -> list[dict]:
    from kernels.norms import add_norm

    n, k = 262144, 640
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(2)]
    norm_w = torch.ones(k, device="cuda", dtype=torch.bfloat16)
    out = []
    for m in rows:
        h = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        d = torch.randn(2, m, k, device="cuda", dtype=torch.float32)

        def chain(head):
            def run(w):
                _, y = add_norm(d, norm_w, 1e-6, True, residual=h)
                return head(y, w)
            return [lambda w=w: run(w) for w in ws * 4]

        cublas = time_graph(chain(lambda y, w: torch.mm(y, w.t(), out_dtype=torch.float32))) * 1e3
        rec = {"gemm": "lm_head", "n": n, "k": k, "rows": m, "cublas_us": round(cublas, 2),
               "floor_us": round(n * k * 2 / 4.2e12 * 1e6, 2), "triton": []}
        for bn in (32, 64, 128):
            for bk in (64, 128):
                for warps in (4, 8):
                    for stages in (2, 3, 4):
                        try:
                            t = time_graph(chain(lambda y, w: skinny_linear_triton(
                                y, w, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, partials=True))) * 1e3
                        except Exception:  # noqa: BLE001 - out of shared memory and the like
                            continue
                        rec["triton"].append((round(t, 2), bn, bk, warps, stages))
        rec["triton"].sort()
        y = add_norm(d, norm_w, 1e-6, True, residual=h)[1]
        t, bn, bk, warps, stages = rec["triton"][0]
        got = skinny_linear_triton(y, ws[0], block_n=bn, block_k=bk, num_warps=warps, num_stages=stages,
                                   partials=True)[0]
        rec["max_abs_diff"] = (got - torch.mm(y, ws[0].t(), out_dtype=torch.float32)).abs().max().item()
        rec["triton"] = rec["triton"][:6]
        rec["speedup_best"] = round(cublas / t, 3)
        print(json.dumps(rec), flush=True)
        out.append(rec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--splits", type=int, nargs="*", default=[],
                    help="also time split-K partial output with these slice counts (o and down)")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--lm-head", action="store_true", help="only the LM head cases (add + norm, then the head)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = []
    if args.lm_head:
        lines = lm_head_cases(args.rows)
        args.shapes = []
    for name in args.shapes:
        for m in args.rows:
            rec = case(name, m, args.sweep, args.splits)
            print(json.dumps(rec), flush=True)
            lines.append(rec)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in lines))


if __name__ == "__main__":
    main()
