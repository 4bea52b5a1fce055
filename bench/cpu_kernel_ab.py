"""Parley's CPU products from two versions of kernels/cpu, in one process: a git revision's sources against the working
tree's, on the decode shapes of real models, interleaved repeats, each timed by its own thread's CPU time on one
thread (so other work on the machine slows both alike rather than one of them).

Each line: one (shape, GEMM, rows, product) with both versions' best time and base / now, and whether every output
bit agrees. Products: the byte codes interleaved in units (kernels/cpu/q8gemm.c; Q8_0 and Q5_0's 5 bits) and the
K-quant super-blocks (kernels/cpu/kgemm.c; Q4_K, Q6_K), on random codes.
Run: python -m bench.cpu_kernel_ab [--base HEAD] [--shapes gemma3-270m] [--rows 1 8 40] [--cflags -DPARLEY_YMM]
"""
from __future__ import annotations

import argparse
import ctypes
import io
import json
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.cpu_matmul import SHAPES, random_superblocks
from kernels import cpu_native
from kernels.cpu_kgemm import KINDS
from kernels.kquant_layout import interleave_units, pack_fifths

ROOT = Path(__file__).resolve().parents[1]


def build_revision(rev: str | None, out: Path, cflags: list[str]) -> ctypes.CDLL:
    """kernels/cpu at `rev` (None: the working tree's), compiled as cpu_native compiles the library (same compiler and
    flags, then `cflags`: a -march there takes the place of -march=native)."""
    src = cpu_native.SOURCE_DIR
    if rev is not None:
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kernels/cpu"], check=True, capture_output=True)
        tarfile.open(fileobj=io.BytesIO(tar.stdout)).extractall(out, filter="data")
        src = out / "kernels" / "cpu"
    compiler = cpu_native._compiler()
    if compiler is None:
        raise SystemExit("no C compiler here")
    own_march = any(c.startswith("-march") for c in cflags)
    flags = [f for f in cpu_native.FLAGS if not (own_march and f.startswith("-march"))]
    lib = out / f"{rev or 'tree'}.so".replace("/", "_")
    subprocess.run([*cpu_native._command(compiler), *flags, *cflags, *map(str, sorted(src.glob("*.c"))), "-o",
                    str(lib), "-lm"], check=True, capture_output=True)
    return _bound(ctypes.CDLL(str(lib)))


def _bound(lib: ctypes.CDLL) -> ctypes.CDLL:
    for name in ("parley_q8gemm", "parley_kgemm", "parley_kq_interleave", "parley_qgemm_isa"):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = cpu_native.SIGNATURES[name]
    return lib


def products(n: int, k: int, rng: np.random.Generator) -> dict:
    """name -> fn(lib, x, y): one product over random codes of this shape (the units' K a multiple of 128, the
    super-blocks' of 256)."""
    out = {}
    scales = torch.from_numpy(rng.uniform(-0.01, 0.01, (n, k // 32)).astype(np.float16))
    for bits, lo, hi in ((8, 0, 256), (5, 112, 144)):
        held = interleave_units(rng.integers(lo, hi, (n, k), dtype=np.uint8))
        codes = torch.from_numpy(pack_fifths(held) if bits == 5 else held)
        out[f"q8gemm-{bits}bit"] = lambda lib, x, y, c=codes, b=bits: lib.parley_q8gemm(
            ctypes.c_void_p(x.data_ptr()), x.shape[0], k, ctypes.c_void_p(c.data_ptr()),
            ctypes.c_void_p(scales.data_ptr()), b, n, None, ctypes.c_void_p(y.data_ptr()), 1)
    if k % 256 == 0:
        for name in ("Q4_K", "Q6_K"):
            out[f"kgemm-{name}"] = _kgemm_fn(random_superblocks(name, n, k, rng), KINDS[name][0], n, k)
    return out


def _kgemm_fn(blocks: torch.Tensor, kind: int, n: int, k: int):
    """The super-block product; each library interleaves the file's codes its own way first (held per library)."""
    held: dict[int, torch.Tensor] = {}

    def run(lib, x, y):
        if id(lib) not in held:
            held[id(lib)] = blocks.clone()
            lib.parley_kq_interleave(ctypes.c_void_p(blocks.data_ptr()), ctypes.c_void_p(held[id(lib)].data_ptr()),
                                     blocks.shape[0] * (k // 256), kind, 1)
        return lib.parley_kgemm(ctypes.c_void_p(x.data_ptr()), x.shape[0], k, ctypes.c_void_p(held[id(lib)].data_ptr()),
                                kind, n, None, ctypes.c_void_p(y.data_ptr()), 1)
    return run


def _best(fn, lib, x, y, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        rc = fn(lib, x, y)
        best = min(best, time.thread_time() - t)
        if rc not in (0, None):
            raise SystemExit(f"the product returned {rc}")
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD", help="the git revision whose kernels/cpu is the baseline")
    ap.add_argument("--shapes", nargs="+", default=["gemma3-270m"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 40])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds: base, now, base, now …")
    ap.add_argument("--max-columns", type=int, default=32768, help="wider matrices (LM heads) are cut to this")
    ap.add_argument("--cflags", nargs="+", default=[],
                    help="both libraries built with these too, e.g. -DPARLEY_YMM (the 256-bit path AVX-VNNI CPUs run) "
                         "or -march=haswell (AVX2 alone)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"base": build_revision(args.base, Path(tmp), args.cflags),
                "now": build_revision(None, Path(tmp), args.cflags)}
        print(json.dumps({"base": args.base, "clock": "thread_time", "threads": 1, "cflags": args.cflags,
                          "isa": libs["now"].parley_qgemm_isa().decode()}))
        rng = np.random.default_rng(0)
        for shape in args.shapes:
            for gemm, k, n in SHAPES[shape]:
                n = min(n, args.max_columns)
                for name, fn in products(n, k, rng).items():
                    for rows in args.rows:
                        x = torch.randn(rows, k)
                        ys = {v: torch.empty(rows, n) for v in libs}
                        best = {v: float("inf") for v in libs}
                        for _ in range(args.rounds):
                            for v, lib in libs.items():
                                best[v] = min(best[v], _best(fn, lib, x, ys[v], args.repeats))
                        print(json.dumps({"shape": shape, "gemm": gemm, "k": k, "n": n, "rows": rows, "product": name,
                                          "base_ms": round(best["base"] * 1e3, 4),
                                          "now_ms": round(best["now"] * 1e3, 4),
                                          "speedup": round(best["base"] / best["now"], 3),
                                          "same_bits": bool(torch.equal(ys["base"], ys["now"]))}), flush=True)


if __name__ == "__main__":
    main()
