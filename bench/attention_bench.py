"""Decode attention microbenchmark for sdpa_varlen on CUDA (Gemma-3-270M shapes).

4 query heads over 1 KV head, head dim 256, bf16; a global layer and a sliding-window-512
layer (ring storage). 1, 8 and 64 sequences at 1k, 4k and 16k context, one query token each.
Prints one JSON line per case: bytes of K/V the step must read, the time of the Triton path
(CUDA-graph replay over rotating caches, so L2 holds none of it; and eager, L2 flushed), the
achieved bandwidth, and ratios against the reference path, a dense `scaled_dot_product_attention`
over pre-gathered K/V, and the measured device-to-device copy bandwidth.

    python bench/attention_bench.py [--check] [--sweep] [--sweep-blocks] [--sweep-short | --prefill | --targets N ...]
                                   [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import replay_ms  # noqa: E402
from kernels import sdpa_varlen, sdpa_varlen_reference  # noqa: E402
import kernels.sdpa_varlen_triton as sdpa_triton  # noqa: E402
from kernels.sdpa_varlen_triton import plan_splits, plan_tiles, sdpa_varlen_triton  # noqa: E402

H, HKV, D = 4, 1, 256
SCALE = 256**-0.5
WINDOW = 512
MAX_WRITE = 64  # ring rows = WINDOW + MAX_WRITE - 1
L2_FLUSH_BYTES = 256 << 20  # rotate caches until one graph replay touches this much


def do_bench(fn, **kw) -> float:
    from triton.testing import do_bench as _do_bench

    return _do_bench(fn, warmup=25, rep=100, return_mode="median", **kw)


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x))
    return 2 * x.numel() / (ms * 1e-3)


def time_graph(fns: list, reps: int = 20) -> float:
    """Median ms per call of `fns`, all captured in one CUDA graph and replayed."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return statistics.median(replay_ms(graph, reps)) / len(fns)


def make_case(seqs: int, ctx: int, layer: str, copies: int):
    rows = ctx if layer == "global" else min(ctx, WINDOW + MAX_WRITE - 1)
    caches = [
        (torch.randn(rows, seqs + 1, HKV, D, device="cuda", dtype=torch.bfloat16),
         torch.randn(rows, seqs + 1, HKV, D, device="cuda", dtype=torch.bfloat16))
        for _ in range(copies)
    ]
    q = torch.randn(seqs, H, D, device="cuda", dtype=torch.bfloat16)
    table = [(i, 1, i, ctx) for i in range(seqs)]  # one decode token per sequence
    seq_info = torch.tensor(table, dtype=torch.int32, device="cuda")
    window = WINDOW if layer == "sliding" else None
    return q, caches, seq_info, window


def case_bytes(seqs: int, ctx: int, layer: str) -> int:
    keys = ctx if layer == "global" else min(ctx, WINDOW)
    return seqs * keys * HKV * D * 2 * 2  # K and V, bf16


def check(q, k, v, seq_info, window, ctx) -> float:
    kw = dict(scale=SCALE, max_q_len=1, max_kv_len=ctx, window=window)
    out = sdpa_varlen(q, k, v, seq_info, impl="triton", **kw)
    ref = sdpa_varlen_reference(q.float(), k.float(), v.float(), seq_info, **kw)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2 or not torch.isfinite(out).all():
        raise SystemExit(f"check failed: relative error {err}")
    return err


def bench_case(seqs: int, ctx: int, layer: str, copy_bw: float, do_check: bool) -> dict:
    nbytes = case_bytes(seqs, ctx, layer)
    storage = 2 * (ctx if layer == "global" else min(ctx, WINDOW + MAX_WRITE - 1)) * (seqs + 1) * D * 2
    copies = max(1, min(64, L2_FLUSH_BYTES // storage))
    q, caches, seq_info, window = make_case(seqs, ctx, layer, copies)
    kw = dict(scale=SCALE, max_q_len=1, max_kv_len=ctx, window=window)
    rec = {"layer": layer, "seqs": seqs, "ctx": ctx, "kv_bytes": nbytes}
    k0, v0 = caches[0]
    if do_check:
        rec["check_rel_err"] = check(q, k0, v0, seq_info, window, ctx)
    _, block_m, block_n = plan_tiles(G=H // HKV, max_q_len=1, head_dim=D, interpret=False)
    span = min(ctx, WINDOW) if window else ctx
    rec["num_splits"] = plan_splits(span=span, block_n=block_n, windowed=bool(window), device=q.device)
    rec["block_m"], rec["block_n"] = block_m, block_n
    fns = [lambda k=k, v=v: sdpa_varlen(q, k, v, seq_info, impl="triton", **kw) for k, v in caches]
    t_graph = time_graph(fns)
    t_eager = do_bench(fns[0])
    t_ref = do_bench(lambda: sdpa_varlen(q, k0, v0, seq_info, impl="reference", **kw))
    # Dense SDPA over K/V already gathered to [S, Hkv, keys, D]: what torch does at best.
    keys = span
    kd = k0[-keys:, :seqs].permute(1, 2, 0, 3).contiguous() if layer == "global" else \
        torch.randn(seqs, HKV, keys, D, device="cuda", dtype=torch.bfloat16)
    vd = torch.randn_like(kd)
    qd = q.view(seqs, H, 1, D)
    try:
        t_dense = do_bench(lambda: F.scaled_dot_product_attention(qd, kd, vd, scale=SCALE, enable_gqa=True))
    except Exception as exc:  # noqa: BLE001 - report, don't die
        t_dense, rec["dense_error"] = None, repr(exc)[:200]
    bw = nbytes / (t_graph * 1e-3)
    rec.update(
        triton_graph_us=round(t_graph * 1e3, 2),
        triton_eager_us=round(t_eager * 1e3, 2),
        reference_us=round(t_ref * 1e3, 2),
        dense_sdpa_us=None if t_dense is None else round(t_dense * 1e3, 2),
        triton_GBps=round(bw / 1e9, 1),
        vs_copy_bw=round(bw / copy_bw, 3),
        speedup_vs_reference=round(t_ref / t_graph, 1),
        speedup_vs_dense_sdpa=None if t_dense is None else round(t_dense / t_graph, 2),
        rotating_copies=copies,
    )
    return rec


def sweep_blocks(copy_bw: float) -> list[dict]:
    """Block/warp/stage variants of the Triton kernel on two decode cases."""
    out = []
    for seqs, ctx in ((1, 16384), (64, 4096)):
        nbytes = case_bytes(seqs, ctx, "global")
        copies = max(1, min(64, L2_FLUSH_BYTES // (nbytes + 1)))
        q, caches, seq_info, _ = make_case(seqs, ctx, "global", copies)
        for block_n in (32, 64, 128):
            for warps in (4, 8):
                for stages in (2, 3):
                    fns = [lambda k=k, v=v: sdpa_varlen_triton(
                        q, k, v, seq_info, scale=SCALE, max_q_len=1, max_kv_len=ctx,
                        block_n=block_n, num_warps=warps, num_stages=stages) for k, v in caches]
                    try:
                        t = time_graph(fns)
                        rec = {"sweep": "blocks", "seqs": seqs, "ctx": ctx, "block_n": block_n, "num_warps": warps,
                               "num_stages": stages, "us": round(t * 1e3, 2),
                               "vs_copy_bw": round(nbytes / (t * 1e-3) / copy_bw, 3)}
                    except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
                        rec = {"sweep": "blocks", "seqs": seqs, "ctx": ctx, "block_n": block_n, "num_warps": warps,
                               "num_stages": stages, "error": repr(exc)[:160]}
                    print(json.dumps(rec), flush=True)
                    out.append(rec)
    return out


def sweep_splits(copy_bw: float) -> list[dict]:
    """Split-K widths on decode cases (the planner's choice is in the main lines)."""
    out = []
    for seqs, ctx, widths in ((1, 4096, (16, 32, 64)), (1, 16384, (32, 64, 128, 256)),
                              (8, 16384, (16, 33, 64)), (64, 1024, (2, 5, 8))):
        nbytes = case_bytes(seqs, ctx, "global")
        copies = max(1, min(64, L2_FLUSH_BYTES // (nbytes + 1)))
        q, caches, seq_info, _ = make_case(seqs, ctx, "global", copies)
        for splits in widths:
            fns = [lambda k=k, v=v: sdpa_varlen_triton(q, k, v, seq_info, scale=SCALE, max_q_len=1, max_kv_len=ctx,
                                                       num_splits=splits) for k, v in caches]
            t = time_graph(fns)
            rec = {"sweep": "splits", "seqs": seqs, "ctx": ctx, "num_splits": splits, "us": round(t * 1e3, 2),
                   "vs_copy_bw": round(nbytes / (t * 1e-3) / copy_bw, 3)}
            print(json.dumps(rec), flush=True)
            out.append(rec)
    return out


def sweep_short(copy_bw: float) -> list[dict]:
    """Decode at chat-length context (keys 192 of a 256 bucket), where launch latency, not bandwidth, rules."""
    out = []
    kv_end, bucket = 192, 256
    for seqs in (1, 8, 64):
        q = torch.randn(seqs, H, D, device="cuda", dtype=torch.bfloat16)
        caches = [(torch.randn(bucket, seqs + 1, HKV, D, device="cuda", dtype=torch.bfloat16),
                   torch.randn(bucket, seqs + 1, HKV, D, device="cuda", dtype=torch.bfloat16)) for _ in range(8)]
        seq_info = torch.tensor([(i, 1, i, kv_end) for i in range(seqs)], dtype=torch.int32, device="cuda")
        nbytes = case_bytes(seqs, kv_end, "global")
        for splits in (1, 2, 3, 4, 6):
            for block_n in (32, 64):
                for warps in (2, 4, 8):
                    for stages in (1, 2):
                        fns = [lambda k=k, v=v: sdpa_varlen_triton(
                            q, k, v, seq_info, scale=SCALE, max_q_len=1, max_kv_len=bucket, num_splits=splits,
                            block_n=block_n, num_warps=warps, num_stages=stages) for k, v in caches]
                        rec = {"sweep": "short", "seqs": seqs, "ctx": kv_end, "num_splits": splits, "block_n": block_n,
                               "num_warps": warps, "num_stages": stages}
                        try:
                            t = time_graph(fns)
                            rec.update(us=round(t * 1e3, 2), vs_copy_bw=round(nbytes / (t * 1e-3) / copy_bw, 3))
                        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
                            rec["error"] = repr(exc)[:160]
                        out.append(rec)
        best = min((r for r in out if r["seqs"] == seqs and "us" in r), key=lambda r: r["us"])
        fns = [lambda k=k, v=v: sdpa_varlen_triton(q, k, v, seq_info, scale=SCALE, max_q_len=1, max_kv_len=bucket)
               for k, v in caches]
        _, _, block_n = plan_tiles(G=H // HKV, max_q_len=1, head_dim=D, interpret=False)
        t = time_graph(fns)
        planned = {"seqs": seqs, "ctx": kv_end, "us": round(t * 1e3, 2), "vs_copy_bw": round(nbytes / (t * 1e-3) / copy_bw, 3),
                   "num_splits": plan_splits(span=bucket, block_n=block_n, windowed=False, device=q.device)}
        print(json.dumps({"sweep": "short-best", **best}), flush=True)
        print(json.dumps({"sweep": "short-planned", **planned}), flush=True)
    return out


PREFILL_HEADS = (("gemma-270m", 4, 1, 256), ("llama-8b", 32, 8, 128))


def prefill_case(name: str, h: int, hkv: int, d: int, chunk: int, ctx: int) -> dict:
    """A prefill chunk of `chunk` rows ending a `ctx`-key prompt, planned splits."""
    k = torch.randn(ctx, 2, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(chunk, h, d, device="cuda", dtype=torch.bfloat16)
    seq_info = torch.tensor([(0, chunk, 0, ctx)], dtype=torch.int32, device="cuda")
    fn = lambda: sdpa_varlen_triton(q, k, v, seq_info, scale=d**-0.5, max_q_len=chunk, max_kv_len=ctx)  # noqa: E731
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t = time_graph([fn])
    return {"sweep": "prefill", "heads": name, "chunk": chunk, "ctx": ctx, "us": round(t * 1e3, 1),
            "peak_mb_over_inputs": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)}


def decode_case(name: str, h: int, hkv: int, d: int, seqs: int, ctx: int) -> dict:
    """One decode row per sequence over `ctx` keys, planned splits, caches rotated past L2."""
    copies = max(1, min(32, L2_FLUSH_BYTES // (2 * ctx * (seqs + 1) * hkv * d * 2)))
    caches = [tuple(torch.randn(ctx, seqs + 1, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
              for _ in range(copies)]
    q = torch.randn(seqs, h, d, device="cuda", dtype=torch.bfloat16)
    seq_info = torch.tensor([(i, 1, i, ctx) for i in range(seqs)], dtype=torch.int32, device="cuda")
    fns = [lambda k=k, v=v: sdpa_varlen_triton(q, k, v, seq_info, scale=d**-0.5, max_q_len=1, max_kv_len=ctx)
           for k, v in caches]
    return {"sweep": "decode", "heads": name, "seqs": seqs, "ctx": ctx, "us": round(time_graph(fns) * 1e3, 2)}


def sweep_prefill(decode: bool = False) -> list[dict]:
    """Prefill chunks at the end of long prompts (and with `decode`, decode rows at 192-16k keys): Gemma-270M and
    Llama-8B heads, the kernel's planned splits."""
    out = []
    for heads in PREFILL_HEADS:
        cases = [(prefill_case, c, ctx) for c, ctx in ((256, 1024), (256, 4096), (256, 16384), (512, 32768))]
        if decode:
            cases += [(decode_case, s, ctx) for s in (1, 8, 64) for ctx in (192, 1024, 4096, 16384)]
        for case, n, ctx in cases:
            rec = {"target_splits": sdpa_triton.TARGET_SPLITS, **case(*heads, n, ctx)}
            print(json.dumps(rec), flush=True)
            out.append(rec)
            torch.cuda.empty_cache()
    return out


def sweep_targets(targets: list[int]) -> list[dict]:
    """sweep_prefill(decode=True) once per TARGET_SPLITS value (the plan's splits before widths double)."""
    out, kept = [], sdpa_triton.TARGET_SPLITS
    try:
        for target in targets:
            sdpa_triton.TARGET_SPLITS = target
            out += sweep_prefill(decode=True)
    finally:
        sdpa_triton.TARGET_SPLITS = kept
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare each case to the reference first")
    ap.add_argument("--sweep", action="store_true", help="also time split-K widths")
    ap.add_argument("--sweep-blocks", action="store_true", help="also time block/warp/stage variants")
    ap.add_argument("--sweep-short", action="store_true", help="only the chat-length decode sweep (skip the main cases)")
    ap.add_argument("--prefill", action="store_true", help="only prefill chunks at the end of long prompts")
    ap.add_argument("--targets", type=int, nargs="+", help="only prefill and decode rows at these TARGET_SPLITS")
    ap.add_argument("--out", type=Path, help="also write the JSON lines here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    lines = [{"device": torch.cuda.get_device_name(), "copy_GBps": round(copy_bw / 1e9, 1),
              "torch": torch.__version__, "triton": __import__("triton").__version__}]
    print(json.dumps(lines[0]), flush=True)
    if args.sweep_short or args.prefill or args.targets:
        if args.targets:
            lines += sweep_targets(args.targets)
        else:
            lines += sweep_short(copy_bw) if args.sweep_short else sweep_prefill()
        if args.out:
            args.out.write_text("".join(json.dumps(r) + "\n" for r in lines))
        return
    for layer in ("global", "sliding"):
        for seqs in (1, 8, 64):
            for ctx in (1024, 4096, 16384):
                rec = bench_case(seqs, ctx, layer, copy_bw, args.check)
                print(json.dumps(rec), flush=True)
                lines.append(rec)
                torch.cuda.empty_cache()
    if args.sweep:
        lines += sweep_splits(copy_bw)
    if args.sweep_blocks:
        lines += sweep_blocks(copy_bw)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in lines))


if __name__ == "__main__":
    main()
