"""Speculative decoding (prompt lookup) against plain decoding, on the embedded model, in one process.

    python bench/speculative.py [--sessions 1 8] [--tokens 192] [--rounds 2] [--warmup 1] [--device cpu|cuda]
                                [--model PATH] [--draft-model PATH | --synthetic-draft] [--dflash DRAFTER.safetensors]

Workloads, greedy, through the engine's runtime (chat template applied):
  code_edit   "rewrite this file with a docstring on every function": each session gets a source file of this repo
  summarise   "summarise this text, quoting its key phrases": each session gets a document of this repo
  open_chat   open questions where the prompt holds nothing to copy (the embedded base model loops on them greedily,
              which lookup catches)
  open_chat_penalised  the same, greedy with repetition_penalty 1.3: no loops, little for lookup to find
  open_chat_sampled    the same with the app's default sampling (T 0.7, top-p 0.95, top-k 40, rep 1.1, seeded): the
              two modes draw different samples, so only their rates compare
With a draft model (--draft-model, or --synthetic-draft: the Llama-1B-shaped synthetic target drafted for by a
4-layer model of the same vocabulary, both random weights: no acceptance, the cost side) a third mode, draft, runs;
with --dflash (a drafter trained for the model by training/dflash.py) the mode dflash.
For each (workload, sessions) each mode runs `warmup` untimed times, then the modes run interleaved, `rounds` times
(every other round in reverse order); the best round of each counts for `ratio`, and `round_ratios` gives the
median and range of the rounds' own ratios (on a shared machine the best rounds of two modes may come from quiet and
busy moments). Decode rate = tokens after each session's first / time from the last first token to the end. Prints one JSON line per
case: both rates, their ratio, tokens per step, drafts accepted, and whether both modes gave the same tokens.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import emit  # noqa: E402

FILES = ["engine/scheduler.py", "engine/prefix_cache.py", "engine/step.py", "engine/text_stream.py",
         "engine/memory.py", "engine/host.py", "engine/commands.py", "engine/sequence.py"]
DOCS = ["docs/PREFIX_CACHE.md", "docs/ENGINE.md", "docs/ARCHITECTURE.md", "docs/QUANTIZED.md"]
QUESTIONS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are three good ways to learn a new language as an adult?",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me a plan for a relaxing weekend in the mountains.",
    "What should I think about before adopting a dog?",
    "Describe how a bill becomes a law, briefly.",
    "Invent a new board game and explain its rules.",
    "What are the pros and cons of working from home?",
]


def _excerpt(path: str, chars: int) -> str:
    text = (ROOT / path).read_text(encoding="utf-8")
    return text[:chars].rsplit("\n", 1)[0]


def params_for(name: str, tokens: int):
    from engine.sampling import SamplingParams

    if name == "open_chat_penalised":
        return SamplingParams(max_tokens=tokens, repetition_penalty=1.3)
    if name == "open_chat_sampled":
        return SamplingParams(max_tokens=tokens, temperature=0.7, top_p=0.95, top_k=40, repetition_penalty=1.1, seed=5)
    return SamplingParams(max_tokens=tokens)


def workload(name: str, i: int) -> str:
    if name == "code_edit":
        code = _excerpt(FILES[i % len(FILES)], 1800)
        return f"Here is a Python file:\n```python\n{code}\n```\nRewrite the whole file with a docstring on every " \
               "function. Output the complete file."
    if name == "summarise":
        return f"{_excerpt(DOCS[i % len(DOCS)], 2400)}\n\nSummarise the text above, quoting its key phrases."
    return QUESTIONS[i % len(QUESTIONS)]


def run_once(rt, prompts: list[list[int]], params) -> dict:
    from engine.sampling import SamplerState
    from engine.sequence import Sequence

    from engine.speculative import PromptLookup

    if rt.batcher.drafter is not None and rt.batcher.drafter.name == "lookup":  # a fresh pool: a repeat must not
        old = rt.batcher.drafter  # draft from the last round's answers; the same settings
        rt.batcher.drafter = PromptLookup(old.config)
        rt.batcher.drafter.max_sequences = old.max_sequences
    seqs = [Sequence(i, list(p), SamplerState(replace(params, seed=params.seed and params.seed + i)),
                     rt.lm.tokenizer.stop_ids, rt.limit) for i, p in enumerate(prompts)]
    b = rt.batcher
    for s in seqs:
        b.add(s)
    while any(not s.generated for s in seqs):
        b.step()
    start, steps = time.perf_counter(), b.steps
    while b.has_work():
        b.step()
    took = time.perf_counter() - start
    decoded = sum(len(s.generated) - 1 for s in seqs)
    drafted, accepted = sum(s.num_drafted for s in seqs), sum(s.num_accepted for s in seqs)
    return {"tok_s": decoded / took, "tokens": [s.generated for s in seqs], "steps": b.steps - steps,
            "per_step": sum(len(s.generated) for s in seqs) / max(1, sum(s.num_steps for s in seqs)),
            "drafted": drafted, "accepted": accepted}


def _profiled(fn, *args):
    import cProfile
    import pstats

    prof = cProfile.Profile()
    out = prof.runcall(fn, *args)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed runs of each mode first: a runtime records a CPU tape (or captures a CUDA graph) "
                         "once for each step width it meets, and a first round would charge that to whichever mode "
                         "meets more widths (lookup's verify steps); the first timed round's ratio is printed apart")
    ap.add_argument("--workloads", nargs="+",
                    default=["code_edit", "summarise", "open_chat", "open_chat_penalised", "open_chat_sampled"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default=None, help="a .gguf file (default: the embedded model)")
    ap.add_argument("--draft-model", default=None, help="a smaller model of the same vocabulary: adds the draft mode")
    ap.add_argument("--dflash", default=None, help="a DFlash drafter trained for the model: adds the dflash mode")
    ap.add_argument("--synthetic-draft", action="store_true",
                    help="target and draft: the synthetic llama-1b and llama-draft shapes (bench/synthetic_gguf.py)")
    ap.add_argument("--profile", action="store_true", help="print where the last lookup round's time went (cProfile)")
    ap.add_argument("--draft-sequences", type=int, nargs="+", default=None,
                    help="drafting caps to compare (PacingConfig.most_sequences; default: the drafter's own)")
    args = ap.parse_args()

    from engine.loading.default_model import default_model_path
    from engine.loading.loader import LoadOptions, load_model
    from engine.runtime import EngineConfig, build_runtime

    cache = Path(tempfile.gettempdir()) / "parley-bench"
    path = Path(args.model) if args.model else default_model_path(cache / "models")
    draft_path = Path(args.draft_model) if args.draft_model else None
    if args.synthetic_draft:
        from bench.synthetic_gguf import synthetic_gguf

        path, draft_path = synthetic_gguf("llama-1b", cache / "synthetic"), synthetic_gguf("llama-draft", cache / "synthetic")
    from engine.backend import resolve_device

    device, dtype = resolve_device(args.device, "auto")  # what the app runs: bf16 on CUDA, fp32 on the CPU
    options = LoadOptions(cache_dir=cache / "cache", device=device, dtype=dtype)
    lm = load_model(path, options)
    draft = load_model(draft_path, options) if draft_path else None
    modes = ("off", "lookup", "draft") if draft else ("off", "lookup")
    if args.dflash:
        from engine.speculative.dflash_net import load as load_dflash

        dflash = load_dflash(Path(args.dflash))
        modes += ("dflash",)
    tok = lm.tokenizer
    for sessions in args.sessions:
        runtimes = {}
        for mode in modes:
            for cap in ([None] if mode == "off" else args.draft_sequences or [None]):
                drafter_path = Path(args.dflash) if mode == "dflash" else draft_path
                rt = build_runtime(lm, EngineConfig(max_sessions=sessions, max_session_tokens=2048, device=device,
                                                    speculative=mode, draft_model=drafter_path),
                                   keep_finished=False,
                                   draft={"draft": draft, "dflash": dflash if args.dflash else None}.get(mode))
                if cap is not None:
                    rt.batcher.drafter.max_sequences = cap
                runtimes[mode if cap is None else f"{mode}@{cap}"] = rt
        for name in args.workloads:
            prompts = [tok.apply_chat_template([{"role": "user", "content": workload(name, i)}])
                       for i in range(sessions)]
            best: dict[str, dict] = {}
            rates: dict[str, list[float]] = {mode: [] for mode in runtimes}
            for _ in range(args.warmup):
                for mode in runtimes:
                    run_once(runtimes[mode], prompts, params_for(name, args.tokens))
            for r in range(args.rounds):
                order = list(runtimes) if r % 2 == 0 else list(runtimes)[::-1]  # neither mode always runs first
                for mode in order:
                    profile = args.profile and mode.startswith("lookup") and r == args.rounds - 1
                    got = _profiled(run_once, runtimes[mode], prompts, params_for(name, args.tokens)) if profile else \
                        run_once(runtimes[mode], prompts, params_for(name, args.tokens))
                    rates[mode].append(got["tok_s"])
                    if mode not in best or got["tok_s"] > best[mode]["tok_s"]:
                        best[mode] = got
            off = best["off"]
            for mode in [m for m in runtimes if m != "off"]:
                on = best[mode]
                paired = sorted(a / b for a, b in zip(rates[mode], rates["off"]))  # each round's ratio: the spread
                emit(workload=name, sessions=sessions, device=device, dtype=dtype, mode=mode, model=path.name,
                     prompt_tokens=[len(p) for p in prompts], off_tok_s=round(off["tok_s"], 1),
                     tok_s=round(on["tok_s"], 1), ratio=round(on["tok_s"] / off["tok_s"], 3),
                     round_ratios=dict(median=round(statistics.median(paired), 3), low=round(paired[0], 3),
                                       high=round(paired[-1], 3), rounds=len(paired)),
                     first_round_ratio=round(rates[mode][0] / rates["off"][0], 3), warmup_rounds=args.warmup,
                     tokens_per_step=round(on["per_step"], 2), drafted=on["drafted"], accepted=on["accepted"],
                     acceptance=round(on["accepted"] / on["drafted"], 3) if on["drafted"] else None,
                     identical=on["tokens"] == off["tokens"])


if __name__ == "__main__":
    main()
