"""Aggregate decode throughput on this CPU: N concurrent sequences in one batch vs the same N one after another.

    python bench/batch_cpu.py [--sessions 1 4 8] [--tokens 32] [--layouts cell sequence]
Prints one JSON line per (layout, sessions) with both aggregates and their ratio.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import embedded_model, emit  # noqa: E402
from bench.common_text import PROMPTS  # noqa: E402


def run(lm, prompts: list[list[int]], layout: str, tokens: int) -> tuple[int, float]:
    from bench.runs import RunConfig, generate
    from engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=tokens)
    start = time.perf_counter()
    seqs = generate(lm, prompts, params, RunConfig(kv_layout=layout, max_seq_len=512))
    return sum(len(s.generated) for s in seqs), time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--layouts", nargs="+", default=["cell", "sequence"])
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    a = ap.parse_args()
    _, lm = embedded_model(a.data_dir)
    # <eos> would end some answers early and skew the comparison: ban nothing, just count what was made.
    lm.tokenizer.stop_ids = frozenset()
    ids = [lm.tokenizer.encode(p, add_bos=True) for p in PROMPTS]
    run(lm, ids[:2], "sequence", 4)  # warm-up
    for layout in a.layouts:
        for n in a.sessions:
            prompts = [ids[i % len(ids)] for i in range(n)]
            made_b, t_b = run(lm, prompts, layout, a.tokens)
            seq = [run(lm, [p], layout, a.tokens) for p in prompts]
            made_s, t_s = sum(m for m, _ in seq), sum(t for _, t in seq)
            emit(
                layout=layout,
                sessions=n,
                batched_tok_s=round(made_b / t_b, 2),
                sequential_tok_s=round(made_s / t_s, 2),
                ratio=round((made_b / t_b) / (made_s / t_s), 3),
            )


if __name__ == "__main__":
    main()
