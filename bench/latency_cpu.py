"""Inter-token gaps of a decoding chat while another chat prefills a 4,000-token prompt.

    python bench/latency_cpu.py [--chunks 32 64 256 0] [--prompt-tokens 4000]
Chunk 0 means no chunking (the whole prompt in one step). Prints JSON lines: the plain decode step,
then per chunk size the p50/p99 gap of the decoding chat during the other's prefill, p99 / plain step,
and the long prompt's time to first token.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import embedded_model, emit  # noqa: E402
from bench.common_text import long_prompt  # noqa: E402


def measure(lm, short: list[int], long: list[int], chunk: int) -> dict:
    from bench.runs import RunConfig, make_batcher
    from engine.sampling import SamplerState, SamplingParams
    from engine.sequence import Sequence

    chunk = chunk or len(long)
    run = RunConfig(max_seq_len=len(long) + 64, step_tokens=chunk + 8, chunk_tokens=chunk)
    b = make_batcher(lm, 2, run)
    a = Sequence(0, list(short), SamplerState(SamplingParams(max_tokens=100_000)))
    b.add(a)
    for _ in range(4):  # a is decoding steadily
        b.step()
    plain = []
    for _ in range(8):
        t = time.perf_counter()
        b.step()
        plain.append(time.perf_counter() - t)
    other = Sequence(1, list(long), SamplerState(SamplingParams(max_tokens=1)))
    b.add(other)
    gaps, start, last = [], time.perf_counter(), time.perf_counter()
    while other.status.value != "finished":
        b.step()
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    ttft = time.perf_counter() - start
    gaps.sort()
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    step = statistics.median(plain)
    return dict(chunk=chunk, plain_step_ms=round(step * 1e3, 1), gap_p50_ms=round(statistics.median(gaps) * 1e3, 1),
                gap_p99_ms=round(p99 * 1e3, 1), p99_over_plain=round(p99 / step, 2), long_ttft_s=round(ttft, 2),
                steps=len(gaps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, nargs="+", default=[32, 64, 256, 0])
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    a = ap.parse_args()
    _, lm = embedded_model(a.data_dir)
    tok = lm.tokenizer
    short = tok.encode("The history of the printing press begins", add_bos=True)
    long = long_prompt(tok, a.prompt_tokens)
    for chunk in a.chunks:
        emit(**measure(lm, short, long, chunk), prompt_tokens=len(long))


if __name__ == "__main__":
    main()
