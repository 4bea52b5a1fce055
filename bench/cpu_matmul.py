"""CPU weight-only matmul candidates on the decode shapes of real models, same process, interleaved repeats.

Each line: one (model shape, GEMM, rows, candidate) with its median time and effective weight bandwidth,
and the ratio against today's fp32 path (MKL sgemm as W @ xᵀ). Candidates:
  fp32            today's path
  bf16            F.linear in bf16 (oneDNN)
  int8-bf16       torch._weight_int8pack_mm, int8 per output channel, bf16 activations
  int8-fp32       the same with fp32 activations
  int4-g32-bf16   torch._weight_int4pack_mm_for_cpu, 4-bit groups of 32 with bf16 scale and zero, bf16 act.
  int4-g32-fp32   the same with fp32 activations
  parley-q8       Parley's own kernel (kernels/cpu/qgemm.c) on Q8_0-like blocks: int8 codes, an fp16 scale per 32
  parley-q4       the same on Q4_K-like blocks: 4-bit codes, an fp16 scale and offset per 32
  parley-q8u      the same Q8_0-like codes interleaved in units for kernels/cpu/q8gemm.c (K a multiple of 128)
  parley-q8t      the same codes in groups of 16 columns for kernels/cpu/amxgemm.c (where AMX tiles run)
  parley-k4       Parley's super-block kernel (kernels/cpu/kgemm.c) on Q4_K super-blocks as a file stores them
  parley-k5       the same on Q5_K super-blocks
  parley-k6       the same on Q6_K super-blocks (random blocks: gguf has no K-quant writer; rel_err is against the
                  kernel's float64 reference rather than fp32)
  parley-k4t      the Q4_K super-blocks in groups of 16 columns for kernels/cpu/amxkgemm.c (where AMX tiles run)
  parley-k5t      the same for Q5_K
Run: python -m bench.cpu_matmul [--shapes gemma3-270m llama-1b] [--rows 1 8] [--impls fp32 parley-q8 ...]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {  # name -> [(gemm, in_features, out_features)]
    "gemma3-270m": [("qkv", 640, 1536), ("o", 1024, 640), ("gate_up", 640, 4096), ("down", 2048, 640),
                    ("head", 640, 262144)],
    "llama-1b": [("qkv", 2048, 3072), ("o", 2048, 2048), ("gate_up", 2048, 16384), ("down", 8192, 2048),
                 ("head", 2048, 128256)],
}


def _candidates(w: torch.Tensor) -> dict:
    """name -> (bytes of weight read per product, fn(x_fp32) -> y)."""
    n, k = w.shape
    wb = w.to(torch.bfloat16)
    scale = w.abs().amax(1).clamp_min(1e-8) / 127
    q8 = (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8)
    g = w.reshape(n, k // 32, 32)
    lo, hi = g.amin(-1), g.amax(-1)
    s4 = ((hi - lo) / 15).clamp_min(1e-8)
    q4 = ((g - lo[..., None]) / s4[..., None]).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    packed = torch._convert_weight_to_int4pack_for_cpu(q4, 1)
    # the kernel computes (q - 8) * scale + zero per group: the group's minimum is zero - 8 * scale
    sz = torch.stack([s4, lo + 8 * s4], -1).transpose(0, 1).contiguous()
    return {
        **_parley(w),
        "fp32": (n * k * 4, lambda x: torch.mm(w, x.t()).t()),
        "bf16": (n * k * 2, lambda x: F.linear(x.to(torch.bfloat16), wb)),
        "int8-bf16": (n * k + n * 2, lambda x: torch._weight_int8pack_mm(x.to(torch.bfloat16), q8,
                                                                         scale.to(torch.bfloat16))),
        "int8-fp32": (n * k + n * 4, lambda x: torch._weight_int8pack_mm(x, q8, scale)),
        "int4-g32-bf16": (n * k // 2 + n * k // 8, lambda x: torch._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), packed, 32, sz.to(torch.bfloat16))),
        "int4-g32-fp32": (n * k // 2 + n * k // 8, lambda x: torch._weight_int4pack_mm_for_cpu(x, packed, 32, sz)),
    }


def _parley(w: torch.Tensor) -> dict:
    """Parley's block kernels, where they build here."""
    from engine.quant.block_codes import pack_nibbles, requantize
    from engine.quant.from_float import _min_max_4bit
    from kernels.cpu_native import cpu_kernel
    from kernels.cpu_qgemm import qgemm

    if cpu_kernel() is None:
        return {}
    n, k = w.shape
    c8 = requantize(w.numpy())
    codes8, s8 = torch.from_numpy(c8.codes), torch.from_numpy(c8.scale).half()
    c4 = _min_max_4bit(w)
    codes4 = torch.from_numpy(pack_nibbles(c4.codes))
    s4, o4 = torch.from_numpy(c4.scale).half(), torch.from_numpy(c4.offset).half()
    return {
        "parley-q8": (n * k + n * k // 16, lambda x: qgemm(x, codes8, s8, None, 8, 32, 128)),
        "parley-q4": (n * k // 2 + n * k // 8, lambda x: qgemm(x, codes4, s4, o4, 4, 32, 0)),
        **(_units(codes8, s8) if k % 128 == 0 else {}),
        **(_superblocks(n, k) if k % 256 == 0 else {}),
    }


def _units(codes8: torch.Tensor, s8: torch.Tensor) -> dict:
    from kernels.cpu_qgemm import q8gemm
    from kernels.kquant_layout import interleave_units

    held = torch.from_numpy(interleave_units(codes8.numpy()))
    return {"parley-q8u": (held.numel() + held.numel() // 16, lambda x: q8gemm(x, held, s8)), **_tiles(codes8, s8)}


def _tiles(codes8: torch.Tensor, s8: torch.Tensor) -> dict:
    """The same codes in groups of 16 columns for the AMX kernel, where its tiles run here."""
    from kernels.cpu_native import amx_ready
    from kernels.cpu_qgemm import amxgemm
    from kernels.kquant_layout import tile_codes, tile_scales

    if not amx_ready() or codes8.shape[0] % 16:
        return {}
    held = torch.from_numpy(tile_codes(codes8.numpy()))
    scales = torch.from_numpy(tile_scales(s8.numpy()))
    return {"parley-q8t": (held.numel() + held.numel() // 16, lambda x: amxgemm(x, held, scales))}


def random_superblocks(name: str, n: int, k: int, rng) -> torch.Tensor:
    """n rows of K/256 random `name` super-blocks (Q4_K, Q5_K, Q6_K) as a file stores them, with small fp16 scales
    (random ones overflow): (n, K/256 · bytes) uint8."""
    import numpy as np

    from kernels.cpu_kgemm import KINDS

    b = rng.integers(0, 256, (n, k // 256, KINDS[name][1]), dtype=np.uint8)
    for off in (208,) if name == "Q6_K" else (0, 2):
        half = rng.uniform(1e-4, 1e-3, b.shape[:2]).astype(np.float16)
        b[..., off:off + 2] = half.view(np.uint8).reshape(*b.shape[:2], 2)
    return torch.from_numpy(b.reshape(n, -1))


def _superblocks(n: int, k: int) -> dict:
    """Q4_K, Q5_K and Q6_K rows of random super-blocks with small fp16 scales (name -> (bytes, fn, reference fn))."""
    import numpy as np

    from kernels.cpu_kgemm import kgemm, kgemm_reference

    rng = np.random.default_rng(0)
    out = {}
    for name, label in (("Q4_K", "parley-k4"), ("Q5_K", "parley-k5"), ("Q6_K", "parley-k6")):
        blocks = random_superblocks(name, n, k, rng)
        out[label] = (blocks.numel(), lambda x, bl=blocks, t=name: kgemm(x, bl, t),
                      lambda x, bl=blocks, t=name: kgemm_reference(x, bl, t))
        out.update(_tiled_superblocks(blocks, name, label))
    return out


def _tiled_superblocks(blocks: torch.Tensor, name: str, label: str) -> dict:
    """The same super-blocks, read as a file's, in groups of 16 columns for the AMX kernel (parley-k4t, parley-k5t),
    where its tiles run here."""
    from kernels.cpu_kgemm import amxkgemm, kgemm_reference, tile
    from kernels.cpu_native import amx_ready
    from kernels.kquant_layout import TILED_TYPES

    if not amx_ready() or name not in TILED_TYPES or blocks.shape[0] % 16:
        return {}
    held = tile(blocks.numpy(), name)
    return {f"{label}t": (held.numel(), lambda x: amxkgemm(x, held, name),
                          lambda x: kgemm_reference(x, blocks, name, lambda raw, _: raw))}  # blocks: the file's


def _time(fn, x, repeats: int, clock=time.perf_counter) -> float:
    fn(x)
    times = []
    for _ in range(repeats):
        t = clock()
        fn(x)
        times.append(clock() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the candidates")
    ap.add_argument("--impls", nargs="+", default=None, help="candidates to time (default: all; fp32 always)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread, timed by its own CPU time: kernels compared on a machine other work shares")
    args = ap.parse_args()
    if args.cpu_time:
        torch.set_num_threads(1)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    print(json.dumps({"threads": torch.get_num_threads(), "clock": clock.__name__, "torch": torch.__version__,
                      "isa": torch.backends.cpu.get_cpu_capability()}))
    torch.manual_seed(0)
    for shape in args.shapes:
        for gemm, k, n in SHAPES[shape]:
            w = torch.randn(n, k) * 0.02
            cands = {name: c for name, c in _candidates(w).items()
                     if args.impls is None or name == "fp32" or name in args.impls}
            for rows in args.rows:
                x = torch.randn(rows, k)
                ref = cands["fp32"][1](x)
                best = {name: float("inf") for name in cands}
                for _ in range(args.rounds):
                    for name, (_, fn, *_own) in cands.items():
                        best[name] = min(best[name], _time(fn, x, args.repeats, clock))
                for name, (nbytes, fn, *own) in cands.items():
                    want = own[0](x) if own else ref
                    err = (fn(x).float() - want).abs().max().item() / want.abs().max().item()
                    print(json.dumps({"shape": shape, "gemm": gemm, "k": k, "n": n, "rows": rows, "impl": name,
                                      "ms": round(best[name] * 1e3, 4), "gb_s": round(nbytes / best[name] / 1e9, 2),
                                      "vs_fp32": round(best["fp32"] / best[name], 2), "rel_err": round(err, 4)}),
                          flush=True)
            del w, cands


if __name__ == "__main__":
    main()
