"""CPU decode and prefill speed: Parley (quantized, optionally dequantized) vs llama.cpp on the same GGUF, one process.

Same thread count on both sides (torch.set_num_threads and llama.cpp n_threads), interleaved rounds so that a
busy machine slows every candidate alike. Measured:
  decode1   one session, greedy, from the first generated token to the last (prefill excluded); with --context N
            after an N-token prompt, so every step attends over N keys and more
  decode8   Parley only: 8 different prompts in one batch (bench/runs.generate), aggregate tok/s after every
            session has its first token; `total_tok_s` counts the whole run, prefills included
  prefill   a ~500-token prompt to its first token (Parley) / through llama_decode (llama.cpp)
EOS never stops a run: every run makes exactly its tokens.

    python -m bench.cpu_decode [--model PATH] [--threads 2] [--tokens 64] [--rounds 3] [--dequantized]
Prints one JSON line per measurement, one per (impl, kind) with the median and best rounds, and a last summary
line with parley_1 / llamacpp_1 and parley_8_aggregate / llamacpp_1 (best rounds).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import emit  # noqa: E402
from bench.common_text import PROMPTS, long_prompt  # noqa: E402


@dataclass(slots=True)
class Timing:
    impl: str
    kind: str  # decode1 | decode8 | prefill
    tokens: int  # tokens the timed span made (decode) or read (prefill)
    seconds: float
    extra: dict | None = None

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


# -- Parley

def load_parley(path: Path, weights: str, cache_dir: Path):
    from engine.loading.loader import LoadOptions, load_model

    lm = load_model(path, LoadOptions(weights=weights, cache_dir=cache_dir))
    lm.tokenizer.stop_ids = frozenset()  # <eos> would end some runs early: every run makes all its tokens
    return lm


def parley_decode1(lm, impl: str, ids: list[int], n: int) -> Timing:
    """n greedy decode steps after the prompt's prefill and first token."""
    from bench.runs import RunConfig, make_batcher
    from engine.sampling import SamplerState, SamplingParams
    from engine.sequence import Sequence

    batcher = make_batcher(lm, 1, RunConfig(max_seq_len=max(1024, len(ids) + n + 8)))
    seq = Sequence(0, list(ids), SamplerState(SamplingParams(max_tokens=n + 1)))
    batcher.add(seq)
    while not seq.generated:  # prefill (possibly several chunks) + first token
        batcher.step()
    start = time.perf_counter()
    while batcher.has_work():
        batcher.step()
    return Timing(impl, "decode1", len(seq.generated) - 1, time.perf_counter() - start)


class _FirstTokens:
    """on_token callback of bench.runs.generate: notes when every prompt has its first token."""

    def __init__(self, n: int):
        self.seen: set[int] = set()
        self.n, self.at = n, None

    def __call__(self, index: int, token: int) -> None:
        self.seen.add(index)
        if self.at is None and len(self.seen) == self.n:
            self.at = time.perf_counter()


def parley_decode8(lm, impl: str, prompts: list[list[int]], n: int) -> Timing:
    """All prompts in one batch; decode-only aggregate after the last first token, and the whole run's."""
    from bench.runs import RunConfig, generate
    from engine.sampling import SamplingParams

    clock = _FirstTokens(len(prompts))
    start = time.perf_counter()
    seqs = generate(lm, prompts, SamplingParams(max_tokens=n + 1), RunConfig(max_seq_len=1024), on_token=clock)
    end = time.perf_counter()
    made = sum(len(s.generated) for s in seqs)
    total = {"total_tok_s": round(made / (end - start), 2), "first_tokens_s": round(clock.at - start, 3)}
    return Timing(impl, "decode8", made - len(prompts), end - clock.at, total)


def parley_prefill(lm, impl: str, ids: list[int]) -> Timing:
    from bench.runs import RunConfig, make_batcher
    from engine.sampling import SamplerState, SamplingParams
    from engine.sequence import Sequence

    batcher = make_batcher(lm, 1, RunConfig(max_seq_len=max(1024, len(ids) + 8)))
    seq = Sequence(0, list(ids), SamplerState(SamplingParams(max_tokens=1)))
    batcher.add(seq)
    start = time.perf_counter()
    while not seq.generated:
        batcher.step()
    return Timing(impl, "prefill", len(ids), time.perf_counter() - start)


# -- llama.cpp

def load_llama(path: Path, threads: int, flash_attn: bool, n_ctx: int = 1024):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                           flash_attn=flash_attn, verbose=False)


def _llama_argmax(llm) -> int:
    import llama_cpp
    import numpy as np

    return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).argmax())


def llama_decode1(llm, ids: list[int], n: int) -> Timing:
    """Greedy: our wall clock over n single-token llama_decode calls + argmax, and llama.cpp's own eval time."""
    import llama_cpp

    llm.reset()
    llm.eval(ids)
    token = _llama_argmax(llm)
    llama_cpp.llama_perf_context_reset(llm.ctx)
    start = time.perf_counter()
    for _ in range(n):
        llm.eval([token])
        token = _llama_argmax(llm)
    seconds = time.perf_counter() - start
    perf = llama_cpp.llama_perf_context(llm.ctx)
    inner = perf.n_eval / (perf.t_eval_ms / 1e3) if perf.t_eval_ms > 0 else None
    return Timing("llamacpp", "decode1", n, seconds, {"llama_perf_tok_s": inner and round(inner, 2)})


def llama_prefill(llm, ids: list[int]) -> Timing:
    llm.reset()
    start = time.perf_counter()
    llm.eval(ids)
    return Timing("llamacpp", "prefill", len(ids), time.perf_counter() - start)


# -- the run

def _emit(t: Timing, round_: int) -> None:
    emit(round=round_, impl=t.impl, kind=t.kind, tokens=t.tokens, seconds=round(t.seconds, 3),
         tok_s=round(t.tok_s, 2), **(t.extra or {}))


def _round(parleys: dict, llm, ids: dict, n: int, prefill: bool) -> list[Timing]:
    """One interleaved round: each Parley model then llama.cpp, per measurement."""
    out = []
    for lm_impl, lm in parleys.items():
        out.append(parley_decode1(lm, lm_impl, ids["short"], n))
    out.append(llama_decode1(llm, ids["short"], n))
    out.append(parley_decode8(parleys["parley-quantized"], "parley-quantized", ids["batch"], n))
    if prefill:
        for lm_impl, lm in parleys.items():
            out.append(parley_prefill(lm, lm_impl, ids["long"]))
        out.append(llama_prefill(llm, ids["long"]))
    return out


def _by_impl(timings: list[Timing]) -> dict[tuple[str, str], list[float]]:
    groups: dict[tuple[str, str], list[float]] = {}
    for t in timings:
        groups.setdefault((t.impl, t.kind), []).append(t.tok_s)
    return groups


def _summary(best: dict[tuple[str, str], float]) -> dict:
    """Ratios of the best rounds: on a shared machine the fastest round is the least disturbed one."""
    llama1 = best[("llamacpp", "decode1")]
    row = {"metric": "summary", "of": "best rounds",
           "parley_1_over_llamacpp_1": round(best[("parley-quantized", "decode1")] / llama1, 3),
           "parley_8_aggregate_over_llamacpp_1": round(best[("parley-quantized", "decode8")] / llama1, 3)}
    if ("parley-dequantized", "decode1") in best:
        row["parley_dequantized_1_over_llamacpp_1"] = round(best[("parley-dequantized", "decode1")] / llama1, 3)
    if ("llamacpp", "prefill") in best:
        row["parley_prefill_over_llamacpp_prefill"] = round(
            best[("parley-quantized", "prefill")] / best[("llamacpp", "prefill")], 3)
    return row


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens timed per session")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill-tokens", type=int, default=500, help="0: skip the prefill measurement")
    ap.add_argument("--dequantized", action="store_true", help="also time Parley on fp32 weights (slow)")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp with flash attention")
    ap.add_argument("--context", type=int, default=0,
                    help="decode1 after a prompt of this many tokens (attention over a long context), not a short one")
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    return ap.parse_args()


def main() -> None:
    import llama_cpp

    a = _args()
    torch.set_num_threads(a.threads)
    if a.model is None:
        from engine.loading.default_model import default_model_path

        a.model = default_model_path(a.data_dir / "models")
    parleys = {"parley-quantized": load_parley(a.model, "quantized", a.data_dir / "cache")}
    if a.dequantized:
        parleys["parley-dequantized"] = load_parley(a.model, "dequantized", a.data_dir / "cache")
    llm = load_llama(a.model, a.threads, a.flash_attn, max(1024, a.context + a.tokens + 64, a.prefill_tokens + 64))
    tok = parleys["parley-quantized"].tokenizer
    first = long_prompt(tok, a.context) if a.context else tok.encode(PROMPTS[0], add_bos=True)
    ids = {"short": first, "batch": [tok.encode(p, add_bos=True) for p in PROMPTS],
           "long": long_prompt(tok, a.prefill_tokens) if a.prefill_tokens else []}
    emit(model=str(a.model), threads=a.threads, torch=torch.__version__, llama_cpp=llama_cpp.__version__,
         isa=torch.backends.cpu.get_cpu_capability(), tokens=a.tokens, rounds=a.rounds, flash_attn=a.flash_attn,
         context=len(ids["short"]),
         quantization=parleys["parley-quantized"].quantization())
    _round(parleys, llm, ids, 4, False)  # warm-up: first-call allocations and kernel choices
    timings = []
    for r in range(a.rounds):
        for t in _round(parleys, llm, ids, a.tokens, bool(a.prefill_tokens)):
            _emit(t, r)
            timings.append(t)
    groups = _by_impl(timings)
    for (impl, kind), rates in groups.items():
        emit(impl=impl, kind=kind, median_tok_s=round(statistics.median(rates), 2), best_tok_s=round(max(rates), 2))
    emit(**_summary({key: max(rates) for key, rates in groups.items()}))


if __name__ == "__main__":
    main()
