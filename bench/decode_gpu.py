"""Decode speed on one GPU: Parley (CUDA graphs, optionally compiled) vs transformers' static cache.

A Gemma-3-270M-shaped model with random bf16 weights (speed does not depend on weight values), the
same weights in both. Per session count: prompt 128, 128 new tokens, greedy. Prints JSON lines:
impl, sessions, ms_per_step (median decode step, host to host), tok_s, floor_ms (weights + KV bytes
over the measured device copy bandwidth), fraction_of_floor, speedup_vs_hf_static.

    python -m bench.decode_gpu --sessions 1 8 64 --out results.jsonl
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.common import replay_ms
from engine.models import gemma3
from engine.models.args import GLOBAL, SLIDING, ModelArgs, RopeArgs

PROMPT, NEW = 128, 128


def gemma270m_args(max_len: int = 32768, **shape) -> ModelArgs:
    """Gemma 3 270M's shape; `shape` overrides sizes (tests use a smaller copy on CPU)."""
    d = dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_layers=18, num_heads=4,
             num_kv_heads=1, head_dim=256, sliding_window=512)
    d.update(shape)
    n = d.pop("num_layers")
    return ModelArgs(
        model_type="gemma3", num_layers=n, rms_norm_eps=1e-6,
        rope={GLOBAL: RopeArgs(1_000_000.0), SLIDING: RopeArgs(10_000.0)},
        layer_types=[GLOBAL if (i + 1) % 6 == 0 else SLIDING for i in range(n)],
        max_position_embeddings=max_len, tie_word_embeddings=True, qk_norm=True,
        query_pre_attn_scalar=float(d["head_dim"]), hidden_act="gelu_pytorch_tanh", **d,
    )


def random_hf_weights(args: ModelArgs, seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named fp32 weights; norms are HF's `w` of a (1 + w) scale, random too."""
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in gemma3.Model(args).state_dict().items()}
    out = {}
    for name, shape in shapes.items():
        std = 0.1 if name.endswith("norm.weight") else 0.02
        out[name] = torch.randn(shape, generator=g) * std
    return out


def parley_model(args: ModelArgs, hf_weights: dict[str, torch.Tensor], dtype: torch.dtype, device) -> gemma3.Model:
    weights = gemma3.sanitize(hf_weights, args)
    with torch.device("meta"):
        model = gemma3.Model(args)
    model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in weights.items()}, strict=True, assign=True)
    model.reset_buffers(device)
    return model.eval().requires_grad_(False)


def hf_model(args: ModelArgs, hf_weights: dict[str, torch.Tensor], dtype: torch.dtype, device):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers, num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads, head_dim=args.head_dim, sliding_window=args.sliding_window,
        layer_types=["full_attention" if t == GLOBAL else "sliding_attention" for t in args.layer_types],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": args.rope[GLOBAL].theta},
                         "sliding_attention": {"rope_type": "default", "rope_theta": args.rope[SLIDING].theta}},
        query_pre_attn_scalar=int(args.query_pre_attn_scalar), max_position_embeddings=args.max_position_embeddings,
        tie_word_embeddings=True, final_logit_softcapping=None, attn_logit_softcapping=None,
        rms_norm_eps=args.rms_norm_eps, hidden_activation="gelu_pytorch_tanh",
    )
    model = Gemma3ForCausalLM(config)
    state = dict(hf_weights)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m or m == "lm_head.weight" for m in missing), (missing, unexpected)
    return model.to(device=device, dtype=dtype).eval()


# -- Parley
def make_batcher(model, args: ModelArgs, sessions: int, max_len: int, *, graphs: bool, compile_decode: bool = False,
                 attention_impl: str = "auto", lookahead: bool = True, decode_gemm: bool = False,
                 fused_kernels: bool = False, decode_splits: int | None = None, step_advance: bool = True,
                 speculative: str = "auto"):
    """The engine's own runtime (build_runtime) for a bench model, with the variant's kernels; storage preallocated."""
    from engine.loading.loader import LoadedModel
    from engine.models.kernel_choice import choose_kernels
    from engine.runtime import EngineConfig, RuntimeTuning, build_runtime

    device = next(model.parameters()).device
    kernels = choose_kernels(device, compile_decode=compile_decode, fused=fused_kernels, decode_gemm=decode_gemm,
                             decode_splits=decode_splits)
    config = EngineConfig(max_sessions=sessions, max_session_tokens=max_len, step_tokens=2048, chunk_tokens=256,
                          compile_decode=compile_decode, lookahead=graphs and lookahead, backend="torch",
                          speculative=speculative)
    tuning = RuntimeTuning(graphs=graphs, kernels=kernels, attention_impl=attention_impl, step_advance=step_advance,
                           preallocate=True)
    lm = LoadedModel("bench", Path("bench"), args, model, tokenizer=None)
    return build_runtime(lm, config, keep_finished=False, tuning=tuning).batcher


def prompts(args: ModelArgs, sessions: int, length: int = PROMPT, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, args.vocab_size, (length,), generator=g).tolist() for _ in range(sessions)]


def run_parley(batcher, prompt_ids: list[list[int]], new: int = NEW) -> tuple[list[list[int]], list[float]]:
    """Generates greedily; returns each session's tokens and the wall time of every decode-only step."""
    from engine.sampling import SamplerState, SamplingParams
    from engine.sequence import Sequence

    seqs = [Sequence(i, list(p), SamplerState(SamplingParams(max_tokens=new))) for i, p in enumerate(prompt_ids)]
    for s in seqs:
        batcher.add(s)
    decode_times = []
    while batcher.has_work():
        decode = all(s.num_uncached <= 1 for s in batcher.scheduler.running) and not batcher.scheduler.waiting
        start = time.perf_counter()
        batcher.step()
        if decode:
            decode_times.append(time.perf_counter() - start)
    return [s.generated for s in seqs], decode_times


def graph_replay_ms(batcher, repeats: int = 50) -> float | None:
    """GPU time of one decode step: the largest captured graph replayed, each replay timed with its own events
    (median). The graph moves its step table on; it is put back between replays, outside the timing."""
    graphs = batcher.runner.graphs
    if graphs is None or not graphs.graphs:
        return None
    graph = graphs.graphs[max(graphs.graphs)][0]
    return statistics.median(replay_ms(graph, repeats + 1, graphs.inputs.kept)[1:])


def profile_during(batcher, label: str, at_replay: int = 20) -> None:
    """Per-kernel GPU time of one decode forward, run eagerly (outside the graph) right after the
    `at_replay`-th next replay with that step's inputs (it rewrites the same K/V)."""
    from torch.profiler import ProfilerActivity, profile

    g = batcher.runner.graphs
    if g is None:
        return
    replay, target = g.run, g.replays + at_replay

    def run(batch):
        logits = replay(batch)
        if g.replays == target:
            b = next(x for x in g.buckets if x >= len(batch.segments))
            with torch.inference_mode(), g.inputs.kept(), profile(activities=[ProfilerActivity.CUDA]) as prof:
                g.forward_step(b)
                torch.cuda.synchronize()
            events = prof.key_averages()
            table = events.table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
            print(f"== profile {label}: {sum(e.count for e in events)} kernels\n{table}", flush=True)
        return logits

    g.run = run


def profile_replay(batcher, label: str, replays: int = 5) -> None:
    """Per-kernel GPU time inside replays of the largest captured graph (with PDL, kernels overlap:
    a kernel's time includes what it spent waiting for the one before)."""
    from torch.profiler import ProfilerActivity, profile

    graphs = batcher.runner.graphs
    if graphs is None or not graphs.graphs:
        return
    graph = graphs.graphs[max(graphs.graphs)][0]
    with graphs.inputs.kept(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):  # a few tokens past the step table: the storage has room (max_len + 16)
            graph.replay()
        torch.cuda.synchronize()
    events = prof.key_averages()
    table = events.table(sort_by="cuda_time_total", row_limit=16, max_name_column_width=60)
    print(f"== replay profile {label}: {sum(e.count for e in events) // replays} kernels per step\n{table}",
          flush=True)


def profiled_steps(batcher, prompt_ids: list[list[int]], steps: int, skip: int | None = None, first_id: int = 0):
    """torch's CUDA profiler over `steps` engine steps of fresh sequences, after `skip` steps or (None) once every
    prompt is in; the sequences then run to their end. Returns the profiler."""
    from torch.profiler import ProfilerActivity, profile

    from engine.sampling import SamplerState, SamplingParams
    from engine.sequence import Sequence

    seqs = [Sequence(first_id + i, list(p), SamplerState(SamplingParams(max_tokens=(skip or 0) + steps + 8)))
            for i, p in enumerate(prompt_ids)]
    for s in seqs:
        batcher.add(s)
    if skip is None:
        while batcher.scheduler.waiting or any(s.num_uncached > 1 for s in batcher.scheduler.running):
            batcher.step()
    for _ in range(skip or 0):
        batcher.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            batcher.step()
        torch.cuda.synchronize()
    while batcher.has_work():
        batcher.step()
    return prof


def timeline(batcher, prompt_ids: list[list[int]], label: str, skip: int = 40, steps: int = 4) -> None:
    """Every GPU operation of `steps` mid-decode engine steps in launch order, graph kernels and the
    copies and kernels around the graph alike: name, start offset and duration in µs, and the idle gap
    before each (where a step's time goes that the kernel table does not show)."""
    import os
    import tempfile

    prof = profiled_steps(batcher, prompt_ids, steps, skip)
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    ops = sorted((e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
    if not ops:
        return
    t0, end = ops[0]["ts"], ops[0]["ts"]
    lines, busy = [], 0.0
    for e in ops:
        gap = e["ts"] - end
        busy += e["dur"]
        lines.append(f"{e['ts'] - t0:9.1f} {e['dur']:7.2f} {gap:7.2f}  {e['name'][:90]}")
        end = max(end, e["ts"] + e["dur"])
    span = end - t0
    print(f"== timeline {label}: {len(ops)} GPU ops in {steps} steps, {span / steps:.1f} us/step, "
          f"sum of op durations {busy / steps:.1f} us/step\n   start     dur     gap  name\n" + "\n".join(lines),
          flush=True)


def host_profile(fn, label: str) -> None:
    """cProfile of the host side of the timed run: where a step's Python and launch time goes."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.runcall(fn)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
    print(f"== host profile {label}\n{text.getvalue()}", flush=True)


# -- transformers, static cache
def hf_ms_per_step(model, prompt_ids: list[list[int]], new: int, compiled: bool = False) -> float:
    """generate() with a static cache; `compiled` lets transformers compile its decode step as it does by default."""
    ids = torch.tensor(prompt_ids, device=model.device)

    def gen(n: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       cache_implementation="static", pad_token_id=0, disable_compile=not compiled)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    gen(2)  # warm-up
    return (gen(new + 1) - gen(1)) / new * 1e3


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


# -- the floor
def copy_bandwidth(device) -> float:
    """Device-to-device copy, bytes read + written per second."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        y.copy_(x)
    end.record()
    end.synchronize()
    return 2 * x.numel() * 20 / (start.elapsed_time(end) / 1e3)


def floor_ms(model, args: ModelArgs, sessions: int, bandwidth: float, context: int = PROMPT + NEW // 2) -> float:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    per_token = 2 * args.num_kv_heads * args.head_dim * 2  # K and V, bf16
    keys = sum(min(context, w) if w else context for w in args.layer_windows())
    return (weights + sessions * keys * per_token) / bandwidth * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--impls", nargs="+", default=["parley-graphs", "parley-compiled", "hf-static"],
                    help="parley-eager | parley-graphs | parley-compiled, suffixes '-sync' (no look-ahead) and "
                         "'-tgemm' (Triton decode GEMMs), '-fused' (Triton norm/rope/activation kernels: "
                         "the engine's default on CUDA without --compile), '-hostcopy' (ids and step table copied "
                         "around each graph, not written/advanced by it); hf-static, "
                         "hf-static-compiled (transformers' own compile of the static cache)")
    ap.add_argument("--hf-new-at-1", type=int, default=8, help="HF static decodes ~0.3 s/step at batch 1: fewer steps")
    ap.add_argument("--hf-sessions", type=int, nargs="*", default=None, help="default: --sessions")
    ap.add_argument("--profile", action="store_true", help="kernel table of one decode forward per run")
    ap.add_argument("--profile-replay", action="store_true", help="kernel table of graph replays per run")
    ap.add_argument("--split-k", type=int, default=None,
                    help="K slices of the o/down decode GEMMs (1 = whole; default: kernels.linear.decode_splits)")
    ap.add_argument("--timeline", action="store_true", help="every GPU op of a few engine steps, in order")
    ap.add_argument("--host-profile", action="store_true", help="cProfile of an extra run per case (after timing)")
    ap.add_argument("--out", default=None)
    opts = ap.parse_args()
    from engine.process import configure_process

    device = torch.device("cuda")
    # what the engine sets when it builds a runtime, here before the baseline's first GEMM
    configure_process(device, compile_decode=any("compiled" in i for i in opts.impls))
    args = gemma270m_args()
    weights = random_hf_weights(args)
    model = parley_model(args, weights, torch.bfloat16, device)
    bw = copy_bandwidth(device)
    hf_ms: dict[str, dict[int, float]] = {}  # baseline impl -> sessions -> ms per step
    out = open(opts.out, "a") if opts.out else None

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    def finish(r: dict) -> None:
        n, ms = r["sessions"], r["ms_per_step"]
        r["tok_s"] = n / ms * 1e3
        r["floor_ms"] = floor_ms(model, args, n, bw)
        r["fraction_of_floor"] = r["floor_ms"] / ms
        for base, by_n in hf_ms.items():
            if n in by_n:
                r[f"speedup_vs_{base.replace('-', '_')}"] = by_n[n] / ms
        emit({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})

    emit({"impl": "device", "copy_bandwidth_tb_s": round(bw / 1e12, 3), "gpu": torch.cuda.get_device_name(),
          "torch": torch.__version__, "transformers": _version("transformers")})
    for base in [i for i in opts.impls if i.startswith("hf-static")]:
        try:
            hf = hf_model(args, weights, torch.bfloat16, device)
            for n in opts.hf_sessions if opts.hf_sessions is not None else opts.sessions:
                new = opts.hf_new_at_1 if n == 1 else NEW
                ms = hf_ms_per_step(hf, prompts(args, n), new, compiled=base == "hf-static-compiled")
                finish({"impl": base, "sessions": n, "ms_per_step": ms, "steps_timed": new})
                hf_ms.setdefault(base, {})[n] = ms
            del hf
        except Exception as exc:  # the baseline's failure must not hide Parley's numbers
            emit({"impl": base, "error": repr(exc)[:300]})
        torch.cuda.empty_cache()
    for impl in [i for i in opts.impls if i.startswith("parley")]:
        for n in opts.sessions:
            flags = set(impl.split("-")[1:])
            b = make_batcher(model, args, n, PROMPT + NEW + 16, graphs="eager" not in flags,
                             compile_decode="compiled" in flags, lookahead="sync" not in flags,
                             decode_gemm="tgemm" in flags, fused_kernels="fused" in flags, decode_splits=opts.split_k,
                             step_advance="hostcopy" not in flags)
            t0 = time.perf_counter()
            _, times = run_parley(b, prompts(args, n))  # warm-up: captures (and compiles) the graphs; slots free after
            warm_s = time.perf_counter() - t0
            _, times = run_parley(b, prompts(args, n, seed=2))
            finish({"impl": impl, "sessions": n, "ms_per_step": statistics.median(times) * 1e3,
                    "mean_ms_per_step": statistics.fmean(times) * 1e3, "steps_timed": len(times),
                    "gpu_ms_per_step": graph_replay_ms(b), "first_run_s": round(warm_s, 2)})
            if opts.profile:
                profile_during(b, f"{impl} x{n}")
            if opts.profile_replay:
                profile_replay(b, f"{impl} x{n}")
            if opts.timeline:
                timeline(b, prompts(args, n, seed=4), f"{impl} x{n}")
            if opts.profile or opts.host_profile:
                host_profile(lambda: run_parley(b, prompts(args, n, seed=3)), f"{impl} x{n}")



if __name__ == "__main__":
    main()
