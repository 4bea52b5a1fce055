"""What sampling costs: decode tokens per second with each sampler setting against greedy, in one process.

    python -m bench.sampling [--device cpu|cuda] [--sessions 1 8] [--tokens 96] [--rounds 2] [--shape gemma-270m]
                             [--context 0] [--sampler-only] [--torch-sampler] [--launches] [--host-profile]
                             [--staging]

Settings: greedy; `app` (the app's defaults: temperature 0.7, top-p 0.95, top-k 40, repetition penalty 1.1 over the
last 64 tokens); `app_whole` (the same penalty over the whole history);
`t1` (temperature 1, nothing else: an OpenAI-style request's defaults); `top_p` (temperature 0.8, top-p 0.9, no top-k);
`min_p` (temperature 1, min-p 0.05); `hot` (temperature 1.5, top-p 0.95). On the CPU the embedded model; on CUDA a model of `--shape` with random bf16
weights on the decode graphs (random weights give flat distributions: top-p's nucleus is large, the worst case).
The settings run interleaved, `rounds` times, the best round of each counts. Decode rate = tokens after each
session's first / time from the step after which every session has its first token to the end. One JSON line
per (setting, sessions): tok/s, ms per step, the ratio to greedy. `--torch-sampler` (CUDA): each setting also as
`setting/torch`, drawn by torch's operations instead of kernels/sampling_triton.py, interleaved in the same process;
`--launches` (CUDA): each also as `setting/launches`, its kernels launched one by one instead of replayed from the
sampling graphs (engine/sampling_graphs.py). `--host-profile`: host time by function (cProfile), ms per step.
`--staging`: the sampling graphs' host side alone (`SamplingGraphs.stage`: a step's plan and its inputs written to
the staging buffer and queued in one copy), µs per step, without and with a look-ahead's pending token; any device.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import emit  # noqa: E402

SETTINGS = {
    "greedy": {},
    "app": dict(temperature=0.7, top_p=0.95, top_k=40, repetition_penalty=1.1, repeat_last_n=64),
    "app_whole": dict(temperature=0.7, top_p=0.95, top_k=40, repetition_penalty=1.1),  # the penalty over all tokens
    "t1": dict(temperature=1.0),
    "top_p": dict(temperature=0.8, top_p=0.9),
    "min_p": dict(temperature=1.0, min_p=0.05),
    "hot": dict(temperature=1.5, top_p=0.95),  # a "creative" preset: flatter rows, the nucleus often past 256 tokens
}


def torch_sampler(setting: str):
    """For a `…/torch` setting, the GPU draw by torch's operations (kernels/sampling_triton.py and the sampling
    graphs turned off)."""
    from contextlib import nullcontext
    from unittest import mock

    from engine import sampling

    return mock.patch.object(sampling, "_gpu_draw", lambda *a: None) if setting.endswith("/torch") else nullcontext()


VARIANTS = ("/torch", "/launches")  # torch's operations; the kernels launched one by one (no sampling graphs)


def timed_run(batcher, prompts: list[list[int]], setting: str, tokens: int, stop_ids=frozenset()) -> dict:
    """Runs every prompt as one sequence of a batch; the decode rate after each sequence's first token."""
    runner = batcher.runner
    graphs = getattr(runner, "sampling_graphs", None)
    if setting.endswith(VARIANTS):
        runner.sampling_graphs = None
    try:
        with torch_sampler(setting):
            return _timed_run(batcher, prompts, setting.split("/")[0], tokens, stop_ids)
    finally:
        if graphs is not None:
            runner.sampling_graphs = graphs


def _timed_run(batcher, prompts: list[list[int]], setting: str, tokens: int, stop_ids=frozenset()) -> dict:
    from engine.sampling import SamplerState, SamplingParams
    from engine.sequence import Sequence

    seqs = []
    for i, ids in enumerate(prompts):
        params = SamplingParams(max_tokens=tokens, seed=100 + i, **SETTINGS[setting])
        seqs.append(Sequence(i, list(ids), SamplerState(params), stop_ids))
        batcher.add(seqs[-1])
    start, steps = None, 0
    while batcher.has_work():
        batcher.step()
        if start is None and all(s.generated for s in seqs):
            start, first = time.perf_counter(), sum(len(s.generated) for s in seqs)
        elif start is not None:
            steps += 1
    elapsed = time.perf_counter() - start
    made = sum(len(s.generated) for s in seqs) - first
    return {"tok_s": made / elapsed, "ms_per_step": 1e3 * elapsed / max(1, steps), "steps": max(1, steps)}


def cpu_batchers(sessions: list[int], data_dir: Path, context: int):
    from bench.common import embedded_model
    from bench.common_text import PROMPTS, long_prompt
    from bench.runs import RunConfig, make_batcher

    _, lm = embedded_model(data_dir)
    prose = long_prompt(lm.tokenizer, context) if context else []
    ids = [prose + lm.tokenizer.encode(" " + p if context else p, add_bos=not context) for p in PROMPTS]
    for n in sessions:
        config = RunConfig(max_seq_len=max(1024, context + 512))
        yield n, make_batcher(lm, n, config), [ids[i % len(ids)] for i in range(n)]


def cuda_batchers(sessions: list[int], shape: str):
    import torch

    from bench.decode_gpu import make_batcher, prompts
    from bench.quant_gpu import SHAPES, build
    from engine.models.kernel_choice import _pdl
    from engine.process import configure_process

    device = torch.device("cuda")
    configure_process(device, compile_decode=False)
    args = SHAPES[shape]()
    model = build(args, False, device)
    for n in sessions:
        batcher = make_batcher(model, args, n, 1024, graphs=True, fused_kernels=True, decode_gemm=_pdl(device),
                               speculative="off")
        yield n, batcher, prompts(args, n, length=64)


def sampler_only(sessions: list[int], settings: list[str], context: int, rounds: int, vocab: int = 262_144,
                 device: str = "cpu", profile: bool = False) -> None:
    """ms per sample_ids call for each setting, histories as the engine passes them (Sequence.history where it has
    one, else the token lists); on CUDA each call waits for its ids. `profile` (CUDA): each kernel's device time too."""
    import random
    from array import array

    import torch

    from engine.sampling import SamplerState, SamplingParams, sample_ids
    from engine.sampling_graphs import SamplingGraphs
    from engine.sequence import Sequence

    rng = random.Random(0)
    for n in sessions:
        logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(n)).to(device)
        tokens = [[rng.randrange(vocab // 8) for _ in range(context)] for _ in range(n)]
        histories = [array("q", t) for t in tokens] if hasattr(Sequence, "history") else tokens
        for setting in settings:
            states = [SamplerState(SamplingParams(seed=i, **SETTINGS[setting.split("/")[0]])) for i in range(n)]
            graphs = SamplingGraphs(device) if device == "cuda" and not setting.endswith(VARIANTS) else None
            call = lambda: sample_ids(logits, states, histories, graphs=graphs).tolist()  # noqa: E731 (waits for the ids)
            best = float("inf")
            with torch_sampler(setting):
                call(), call()  # the second call captures a graph
                for _ in range(rounds):
                    start = time.perf_counter()
                    for _ in range(20):
                        call()
                    best = min(best, (time.perf_counter() - start) / 20)
                kernels = profile_calls(call) if profile else {}
            emit(device=device, sessions=n, context=context, setting=setting, sampler_ms=round(1e3 * best, 3),
                 **({"device_us_per_call": kernels} if profile else {}))


def staging(sessions: list[int], settings: list[str], context: int, rounds: int, vocab: int = 262_144,
            device: str = "cpu") -> None:
    """µs per `SamplingGraphs.stage` call for each drawn setting, each session's history growing a token a step."""
    import random
    from array import array

    import torch

    from engine.sampling import SamplerState, SamplingParams
    from engine.sampling_graphs import SamplingGraphs

    rng = random.Random(0)
    for n, setting, ahead in ((n, s, a) for n in sessions for s in settings if s != "greedy" for a in (False, True)):
        logits = torch.zeros(n, vocab, device=device)
        histories = [array("q", (rng.randrange(vocab) for _ in range(context + i))) for i in range(n)]
        states = [SamplerState(SamplingParams(seed=i, **SETTINGS[setting])) for i in range(n)]
        pending = torch.zeros(n, dtype=torch.int64, device=device) if ahead else None
        graphs = SamplingGraphs(torch.device(device), capture=False)

        def step():
            graphs.stage(logits, states, histories, [len(h) + ahead for h in histories], pending)
            for h in histories:
                h.append(rng.randrange(vocab))

        best, calls = float("inf"), 2000 // n + 50
        for _ in range(20):
            step()
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                step()
            best = min(best, (time.perf_counter() - start) / calls)
        emit(device=device, sessions=n, context=context, setting=setting, pending=ahead, staging_us=round(1e6 * best, 1))


def profile_calls(call, calls: int = 10) -> dict[str, float]:
    """The device time per call of each kernel `call` launches (torch.profiler), the 8 largest, µs."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
    rows = [(e.key, e.device_time_total / calls) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return {name[:60]: round(us, 1) for name, us in rows[:8]}


def host_profile(run, top: int = 12) -> dict[str, dict[str, float]]:
    """cProfile over one `run` (it returns its step count), ms per step: the `top` functions by own host time, and
    the repository's `top` by cumulative time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    steps = prof.runcall(run)["steps"]
    stats = pstats.Stats(prof).stats
    name = lambda k: f"{Path(k[0]).parent.name}/{Path(k[0]).name}:{k[1]}:{k[2]}"[:70]  # noqa: E731
    own = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    ours = [kv for kv in stats.items() if "/engine/" in kv[0][0] or "/kernels/" in kv[0][0]]
    cumulative = sorted(ours, key=lambda kv: -kv[1][3])[:top]
    per_step = lambda t: round(1e3 * t / steps, 4)  # noqa: E731
    return {"own": {name(k): per_step(v[2]) for k, v in own},
            "cumulative": {name(k): per_step(v[3]) for k, v in cumulative}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--shape", default="gemma-270m", help="CUDA: the random-weights shape (bench/quant_gpu.py)")
    ap.add_argument("--context", type=int, default=0, help="CPU: tokens of prose before each prompt")
    ap.add_argument("--sampler-only", action="store_true", help="time the sampler alone on random logits")
    ap.add_argument("--torch-sampler", action="store_true", help="CUDA: each setting by torch's operations too")
    ap.add_argument("--launches", action="store_true",
                    help="CUDA: each setting also with its kernels launched one by one (no sampling graphs)")
    ap.add_argument("--profile", action="store_true", help="--sampler-only on CUDA: each kernel's device time")
    ap.add_argument("--host-profile", action="store_true",
                    help="end to end: after the rounds, one more run of each setting under cProfile (host time by function)")
    ap.add_argument("--staging", action="store_true", help="time the sampling graphs' host side alone")
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    a = ap.parse_args()
    for flag, suffix in ((a.torch_sampler, "/torch"), (a.launches, "/launches")):
        if flag:
            a.settings = [x for s in a.settings for x in ([s] if s == "greedy" or "/" in s else [s, s + suffix])]
    if a.staging:
        return staging(a.sessions, a.settings, a.context, a.rounds, device=a.device)
    if a.sampler_only:
        return sampler_only(a.sessions, a.settings, a.context, a.rounds, device=a.device, profile=a.profile)
    made = cpu_batchers(a.sessions, a.data_dir, a.context) if a.device == "cpu" else cuda_batchers(a.sessions, a.shape)
    for n, batcher, prompts in made:
        timed_run(batcher, prompts, "app", 8)  # warm-up: graphs, kernels, the sampler's first calls
        best: dict[str, dict] = {}
        for _ in range(a.rounds):
            for setting in ["greedy", *(s for s in a.settings if s != "greedy")]:
                r = timed_run(batcher, prompts, setting, a.tokens)
                if setting not in best or r["tok_s"] > best[setting]["tok_s"]:
                    best[setting] = r
        for setting, r in best.items():
            emit(device=a.device, shape=a.shape if a.device == "cuda" else "embedded", sessions=n, context=a.context, setting=setting,
                 tok_s=round(r["tok_s"], 1), ms_per_step=round(r["ms_per_step"], 3),
                 vs_greedy=round(r["tok_s"] / best["greedy"]["tok_s"], 3))
        if a.host_profile:
            for setting in best:
                emit(device=a.device, sessions=n, setting=setting,
                     host_ms_per_step=host_profile(lambda: timed_run(batcher, prompts, setting, a.tokens)))


if __name__ == "__main__":
    main()
