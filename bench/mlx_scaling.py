"""Aggregate decode scaling of the MLX backend: batch 1 -> 8 -> 32 concurrent sequences.

    python bench/mlx_scaling.py [--sessions 1 8 32] [--tokens 64] [--model default|PATH]
Meant for Apple silicon (mlx-lm's batch generator reaches 5.7-6.1x at 32); on Linux `mlx[cpu]` runs it
only as a smoke test, with speed that says nothing about a Mac. Prints JSON lines with tok/s and the
ratio to batch 1 measured in the same run.
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.batch_cpu import PROMPTS  # noqa: E402
from bench.common import emit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    a = ap.parse_args()
    from bench.runs import RunConfig, generate
    from engine.loading.default_model import resolve_model
    from engine.loading.loader import LoadOptions, load_model
    from engine.sampling import SamplingParams

    lm = load_model(resolve_model(a.model, a.data_dir / "models"), LoadOptions(dtype=a.dtype, cache_dir=a.data_dir / "cache"))
    lm.tokenizer.stop_ids = frozenset()  # every sequence makes exactly --tokens tokens
    ids = [lm.tokenizer.encode(p, add_bos=True) for p in PROMPTS]
    run = RunConfig(max_seq_len=512, backend="mlx")
    generate(lm, ids[:1], SamplingParams(max_tokens=4), run)  # warm-up
    base = None
    for n in a.sessions:
        prompts = [ids[i % len(ids)] for i in range(n)]
        start = time.perf_counter()
        seqs = generate(lm, prompts, SamplingParams(max_tokens=a.tokens), run)
        rate = sum(len(s.generated) for s in seqs) / (time.perf_counter() - start)
        base = base or rate
        emit(backend="mlx", machine=platform.machine(), system=platform.system(), sessions=n,
             tok_s=round(rate, 1), scaling_vs_1=round(rate / base, 2))


if __name__ == "__main__":
    main()
