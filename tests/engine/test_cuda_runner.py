"""The CUDA path of the `sequence` layout: step table, kernels, decode graphs.

The first tests run anywhere (the kernel path with the PyTorch reference kernels on CPU). The rest need
a CUDA device and use a Gemma-3-270M-shaped model with random bf16 weights. bf16 GEMMs of different
row counts may reduce in different orders, so "batched == alone" is checked as: logits agree within a
bound while the inputs agree, and any token that differs is a near-tie that the measured gap explains.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest
import torch

from bench.decode_gpu import gemma270m_args, make_batcher as _batcher, parley_model, prompts, random_hf_weights
from engine.cache import CacheConfig, make_cache
from engine.models.kernel_choice import KernelChoice
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence
from engine.step_inputs import StepInputs
from tests.support.engine_helpers import run_staggered

CUDA = torch.cuda.is_available()


def needs_cuda(test):
    """Marked `gpu` (make test-gpu) and skipped without a CUDA device."""
    skip = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (decode graphs and Triton kernels)")
    return pytest.mark.gpu(skip(test))
REL_GAP = 0.05  # bf16 through 18 layers: logits of two reduction orders agree within 5% of their scale


def tiny_args():
    return gemma270m_args(max_len=256, vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=6,
                          num_heads=4, num_kv_heads=1, head_dim=32, sliding_window=8)


def make_batcher(*args, **kwargs):
    """Plain decoding: these tests record one logit row per sequence and step, and a prompt-lookup verify step
    (speculative auto, engine/speculative) samples several (tests/engine/test_speculative_cuda.py covers those)."""
    return _batcher(*args, speculative="off", **kwargs)


def generate(batcher, prompt_ids, arrivals, new, params: SamplingParams | None = None):
    """Staggered greedy generation (or with `params`); returns tokens and every sampled logit row, per sequence."""
    seen = defaultdict(list)
    run = batcher.runner.run

    def recording(batch):
        logits, argmax = run(batch)
        for i, seq in enumerate(batch.samplers):
            seen[seq.seq_id].append(logits[i].float().clone())
        return logits, argmax

    batcher.runner.run = recording
    params = params or SamplingParams(max_tokens=new)
    seqs = [Sequence(i, list(p), SamplerState(params)) for i, p in enumerate(prompt_ids)]
    step = 0
    while step <= max(arrivals) or batcher.has_work():
        for i, at in enumerate(arrivals):
            if at == step:
                batcher.add(seqs[i])
        batcher.step()
        step += 1
    return [s.generated for s in seqs], [seen[i] for i in range(len(seqs))]


def compare(tokens_a, logits_a, tokens_b, logits_b) -> dict:
    """Asserts agreement up to bf16 reduction order; returns the measured gaps."""
    worst, flips = 0.0, 0
    for ta, la, tb, lb in zip(tokens_a, logits_a, tokens_b, logits_b):
        d = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta))
        scale = max(float(x.abs().max()) for x in la[: d + 1])
        gap = max(float((x - y).abs().max()) for x, y in zip(la[: d + 1], lb[: d + 1]))
        worst = max(worst, gap / scale)
        assert gap <= REL_GAP * scale, f"logit gap {gap:.4f} exceeds {REL_GAP:.0%} of the scale {scale:.3f}"
        if d < len(ta):
            flips += 1
            top2 = la[d].topk(2).values
            margin = float(top2[0] - top2[1])
            assert margin <= 2 * gap, f"token {d} differs but the margin {margin:.4f} > 2 × gap {gap:.4f}"
    return {"max_rel_gap": worst, "tie_flips": flips}


def report(name: str, row: dict) -> None:
    print(name, row)
    out = os.environ.get("PARLEY_TEST_REPORT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"test": name} | row) + "\n")


# -- anywhere: the step table and the kernel path on the reference kernels
def test_step_table_pads_and_wraps_rings():
    cfg = CacheConfig(layout="sequence", max_seqs=3, max_seq_len=64, capacity=192, dtype="float32", max_step_tokens=4)
    cache = make_cache(cfg, [8, None], 1, 16, "cpu")
    cache.attention_impl = "reference"
    inputs = StepInputs(cache)
    a, b = cache.seq_new(), cache.seq_new()
    cache.declare_step([(a, 4), (b, 2)])
    inputs.prepare()
    cache.commit_step()
    for _ in range(3):  # a reaches 13 > ring of 8 + 4 - 1 = 11 rows
        cache.declare_step([(a, 3)])
        inputs.prepare()
        cache.commit_step()
    cache.declare_step([(b, 1), (a, 1)])
    plan, C = inputs.prepare(num_tokens=4, num_segments=4, tokens=torch.tensor([7, 9])), cache.columns
    assert plan.seq_info.tolist() == [[0, 1, b, 3], [1, 1, a, 14], [0, 0, 3, 0], [0, 0, 3, 0]]
    assert plan.layer_slots[1].tolist() == [2 * C + b, 13 * C + a, 3, 3]  # global: row = position
    assert plan.layer_slots[0].tolist() == [2 * C + b, (13 % 11) * C + a, 3, 3]  # ring: row = position % 11
    assert (plan.max_q_len, plan.max_kv_len) == (1, 256)
    assert inputs.positions.tolist() == [2, 13, 0, 0] and inputs.tokens[:2].tolist() == [7, 9]
    with torch.inference_mode():
        inputs.tokens[:2] = torch.tensor([4, 5])  # what a graph's argmax leaves there
    cache.abort_step()
    cache.abort_step()  # nothing pending: nothing to do
    assert not cache.has_pending_step
    cache.declare_step([(b, 1), (a, 1)])
    assert cache.has_pending_step
    inputs.prepare(num_tokens=4, num_segments=4)  # no ids: the look-ahead step reads them in place
    assert inputs.tokens[:2].tolist() == [4, 5] and inputs.positions.tolist() == [2, 13, 0, 0]
    cache.abort_step()


def test_kernel_path_matches_loop_on_cpu():
    args = tiny_args()
    model = parley_model(args, random_hf_weights(args, seed=3), torch.float32, "cpu")
    ids = prompts(args, 4, length=20)
    ids = [p[:n] for p, n in zip(ids, [3, 9, 20, 14])]
    runs = {}
    for impl in ("auto", "reference"):
        b = make_batcher(model, args, 4, 64, graphs=False, attention_impl=impl)
        runs[impl] = generate(b, ids, [0, 0, 1, 3], new=10)
    assert runs["auto"][0] == runs["reference"][0]
    compare(*runs["auto"], *runs["reference"])


# -- CUDA
@pytest.fixture(scope="module")
def gpu_model():
    args = gemma270m_args(max_len=1024)
    return args, parley_model(args, random_hf_weights(args, seed=0), torch.bfloat16, "cuda")


@needs_cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["graphs", "compiled-graphs"])
def test_graph_path_equals_eager(gpu_model, compiled):
    args, model = gpu_model
    ids = [p[:n] for p, n in zip(prompts(args, 8, length=300), [5, 17, 40, 64, 100, 128, 200, 300])]
    graph_b = make_batcher(model, args, 8, 400, graphs=True, compile_decode=compiled)
    graph = generate(graph_b, ids, [0] * 8, new=24)
    eager = generate(make_batcher(model, args, 8, 400, graphs=False), ids, [0] * 8, new=24)
    assert graph_b.runner.graphs.replays >= 20 and graph_b.runner.graphs.captures >= 1
    row = compare(*graph, *eager)
    if not compiled:  # same shapes, same kernels: the replay should be bit-exact
        row["exact_logits"] = all(torch.equal(x, y) for la, lb in zip(graph[1], eager[1]) for x, y in zip(la, lb))
    report(f"graph_vs_eager[{'compiled' if compiled else 'graphs'}]", row | {"tokens_equal": graph[0] == eager[0]})


@needs_cuda
@pytest.mark.parametrize("kernels", ["cublas", "triton"])
def test_batched_equals_alone_through_graphs(gpu_model, kernels):
    """`triton`: the decode GEMMs with their fused norm prologues / activation epilogue and the fused
    norm/rope/K-V-write kernels, the default on Hopper."""
    args, model = gpu_model
    lengths, arrivals = [3, 30, 129, 250, 7, 64], [0, 0, 1, 2, 4, 9]
    ids = [p[:n] for p, n in zip(prompts(args, 6, length=250, seed=5), lengths)]
    opts = dict(graphs=True, decode_gemm=kernels == "triton", fused_kernels=kernels == "triton")
    batched = generate(make_batcher(model, args, 6, 400, **opts), ids, arrivals, new=32)
    singles = [generate(make_batcher(model, args, 1, 400, **opts), [p], [0], new=32) for p in ids]
    alone = ([s[0][0] for s in singles], [s[1][0] for s in singles])
    row = compare(*batched, *alone)
    report(f"batched_vs_alone[{kernels}]", row | {"tokens_equal": batched[0] == alone[0]})


@needs_cuda
def test_lookahead_equals_sync_through_graphs(gpu_model):
    """Queuing the next decode step before reading the ids replays the same graphs on the same inputs."""
    args, model = gpu_model
    ids = [p[:n] for p, n in zip(prompts(args, 5, length=200, seed=7), [9, 50, 120, 200, 33])]
    for arrivals in ([0] * 5, [0, 0, 2, 3, 5]):
        runs = {}
        for ahead in (False, True):
            b = make_batcher(model, args, 5, 400, graphs=True, lookahead=ahead)
            runs[ahead] = generate(b, ids, arrivals, new=40)
            assert (b.lookahead_steps > 20) == ahead
        exact = all(torch.equal(x, y) for la, lb in zip(runs[True][1], runs[False][1]) for x, y in zip(la, lb))
        row = compare(*runs[True], *runs[False])
        report(f"lookahead_vs_sync[{'together' if max(arrivals) == 0 else 'staggered'}]",
               row | {"tokens_equal": runs[True][0] == runs[False][0], "exact_logits": exact})
        if max(arrivals) == 0:  # the same steps through the same graphs: bit for bit
            assert exact and runs[True][0] == runs[False][0]
        # Staggered, a sequence arriving while a step is queued ahead joins one step later, so some
        # decode rows run in a mixed eager step in one run and in a graph in the other: bf16 order.


@needs_cuda
def test_fused_kernels_agree_with_the_modules(gpu_model):
    """The engine's uncompiled default on Hopper (graphs, PDL, fused norm/rope/K-V-write kernels, Triton decode
    GEMMs with the activation in gate/up's epilogue) against eager modules."""
    args, model = gpu_model
    ids = [p[:n] for p, n in zip(prompts(args, 4, length=300, seed=6), [5, 64, 200, 300])]
    fused = generate(make_batcher(model, args, 4, 400, graphs=True, fused_kernels=True, decode_gemm=True), ids,
                     [0] * 4, new=24)
    eager = generate(make_batcher(model, args, 4, 400, graphs=False), ids, [0] * 4, new=24)
    report("fused_vs_eager", compare(*fused, *eager) | {"tokens_equal": fused[0] == eager[0]})


@needs_cuda
def test_triton_decode_gemm_agrees_with_cublas(gpu_model):
    args, model = gpu_model
    ids = [p[:n] for p, n in zip(prompts(args, 6, length=300, seed=4), [5, 40, 64, 100, 200, 300])]
    cublas = generate(make_batcher(model, args, 6, 400, graphs=True), ids, [0] * 6, new=24)
    triton = generate(make_batcher(model, args, 6, 400, graphs=True, decode_gemm=True), ids, [0] * 6, new=24)
    report("decode_gemm_vs_cublas", compare(*triton, *cublas) | {"tokens_equal": triton[0] == cublas[0]})


@needs_cuda
def test_triton_equals_reference_attention(gpu_model):
    """Teacher-forced: the same tokens through both attention implementations, logits compared."""
    args, model = gpu_model
    ids = [p[:n] for p, n in zip(prompts(args, 4, length=600, seed=9), [11, 200, 513, 600])]
    model.prepare(KernelChoice(fuse_projections=True))  # the modules around attention, as the eager runners
    out = {}
    for impl in ("triton", "reference"):
        cfg = CacheConfig(layout="sequence", max_seqs=4, max_seq_len=700, capacity=2800, dtype="bfloat16",
                          max_step_tokens=256)
        cache = make_cache(cfg, args.layer_windows(), args.num_kv_heads, args.head_dim, "cuda")
        cache.attention_impl = impl
        inputs = StepInputs(cache)
        slots = [cache.seq_new() for _ in ids]
        done, rows = [0] * 4, []
        with torch.inference_mode():
            while any(d < len(p) for d, p in zip(done, ids)):  # chunks of up to 256, all sequences per step
                writes = [(s, min(256, len(p) - d)) for s, p, d in zip(slots, ids, done) if d < len(p)]
                segs = cache.declare_step(writes)
                live = [i for i, (p, d) in enumerate(zip(ids, done)) if d < len(p)]
                toks = [t for i, (_, n) in zip(live, writes) for t in ids[i][done[i] : done[i] + n]]
                pos = [x for seg in segs for x in range(seg.start, seg.start + seg.q_len)]
                last = torch.tensor([seg.q_start + seg.q_len - 1 for seg in segs], device="cuda")
                inputs.prepare()
                rows.append(model(torch.tensor(toks, device="cuda"), torch.tensor(pos, device="cuda"), cache, last))
                cache.commit_step()
                for i, (_, n) in zip(live, writes):
                    done[i] += n
        out[impl] = torch.cat(rows).float()
    scale = float(out["reference"].abs().max())
    gap = float((out["triton"] - out["reference"]).abs().max())
    report("triton_vs_reference", {"max_gap": gap, "scale": scale,
                                   "argmax_equal": bool((out["triton"].argmax(-1) == out["reference"].argmax(-1)).all())})
    assert gap <= REL_GAP * scale


@needs_cuda
def test_step_advance_equals_host_copies(gpu_model):
    """Graphs that hand their ids to the host and move the step table on themselves (the default) against
    graphs framed by copies: bit for bit, while sessions arrive, finish at different lengths, and one samples
    (its ids are copied in and out; the table still moves on in the graph)."""
    args, model = gpu_model
    ids = [p[:n] for p, n in zip(prompts(args, 5, length=200, seed=11), [9, 60, 120, 200, 33])]
    params = [SamplingParams(max_tokens=m) for m in (40, 12, 33, 40)] + \
        [SamplingParams(max_tokens=30, temperature=0.9, top_k=40, seed=3)]
    runs = {}
    for advance in (True, False):
        b = make_batcher(model, args, 5, 400, graphs=True, step_advance=advance)
        runs[advance] = run_staggered(b, ids, [0, 0, 2, 5, 7], params)
        assert b.runner.graphs.step_advance == advance and b.lookahead_steps > 10
    assert runs[True] == runs[False]
    assert [len(t) for t in runs[True]] == [40, 12, 33, 40, 30]


@needs_cuda
def test_drawn_steps_replay_their_draw_from_graphs(gpu_model):
    """Every session draws (the app's defaults: penalties, a look-ahead's pending token, arrivals changing the rows):
    the draw replayed from the sampling graphs (engine/sampling_graphs.py) gives the launch-by-launch draw's tokens."""
    args, model = gpu_model
    ids = [p[:n] for p, n in zip(prompts(args, 3, length=100, seed=17), [12, 70, 31])]
    params = [SamplingParams(max_tokens=40, temperature=0.7, top_p=0.95, top_k=40, repetition_penalty=1.1,
                             repeat_last_n=64, seed=s) for s in (1, 2, 3)]
    runs = {}
    for graphed in (False, True):
        b = make_batcher(model, args, 3, 400, graphs=True)
        if not graphed:
            b.runner.sampling_graphs = None
        runs[graphed] = run_staggered(b, ids, [0, 0, 3], params)
        assert b.lookahead_steps > 10
    assert b.runner.sampling_graphs.replays > 20
    assert runs[True] == runs[False]


@needs_cuda
def test_penalised_sequences_run_ahead_through_graphs(gpu_model):
    """Penalties of a look-ahead step count the previous step's token from the device, taken before the graph writes
    its own ids over it: the same tokens as without look-ahead (all sessions arrive together: the same graphs)."""
    args, model = gpu_model
    ids = [p[:n] for p, n in zip(prompts(args, 4, length=120, seed=13), [9, 60, 120, 33])]
    params = [SamplingParams(max_tokens=32, repetition_penalty=1.5, frequency_penalty=0.3),
              SamplingParams(max_tokens=32, temperature=0.7, top_p=0.95, top_k=40, repetition_penalty=1.1, seed=4),
              SamplingParams(max_tokens=32, temperature=1.0, seed=5),
              SamplingParams(max_tokens=32)]
    runs = {}
    for ahead in (False, True):
        b = make_batcher(model, args, 4, 400, graphs=True, lookahead=ahead)
        runs[ahead] = run_staggered(b, ids, [0] * 4, params)
        assert (b.lookahead_steps > 10) == ahead
    assert runs[True] == runs[False]
