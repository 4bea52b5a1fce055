"""The engine's invariant on tiny models: batched greedy tokens == each sequence alone; fork and rewind too."""
import json

import pytest
import torch

from cli.main import main
from engine.errors import CacheError
from bench.runs import RunConfig, make_batcher, make_runtime
from engine.loading.loader import load_model
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence
from kernels.cpu_native import cpu_kernel
from tests.support.engine_helpers import alone, full_logits, run_staggered
from tests.support.tiny_models import ARCHS

LENGTHS = [3, 9, 17, 30, 45, 61]  # gemma3's tiny window is 8: most prompts wrap its ring (15 rows)
ARRIVALS = [0, 0, 1, 2, 4, 7]
GREEDY = SamplingParams(max_tokens=20)


def _run(layout: str) -> RunConfig:
    return RunConfig(kv_layout=layout, max_seq_len=128, step_tokens=16, chunk_tokens=8)


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(6, vocab, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def models(tiny_models):
    return {arch: load_model(tiny_models[arch].gguf_path) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_batched_equals_alone(models, arch, layout):
    lm = models[arch]
    prompts = _prompts(lm.args.vocab_size)
    batched = run_staggered(make_batcher(lm, 6, _run(layout)), prompts, ARRIVALS, GREEDY)
    singles = [alone(lm, p, GREEDY, _run(layout)) for p in prompts]
    assert batched == singles
    assert all(len(t) == GREEDY.max_tokens for t in batched)


def test_layouts_agree(models):
    lm = models["gemma3"]
    prompts = _prompts(lm.args.vocab_size)
    seq = run_staggered(make_batcher(lm, 6, _run("sequence")), prompts, ARRIVALS, GREEDY)
    cell = run_staggered(make_batcher(lm, 6, _run("cell")), prompts, ARRIVALS, GREEDY)
    assert seq == cell


@pytest.mark.skipif(cpu_kernel() is None, reason="the CPU library does not build here")
@pytest.mark.parametrize("arch", ARCHS)
def test_a_prompt_computes_the_same_however_its_steps_cut_it(tiny_models_q4, arch):
    """One token a step, chunks, the whole prompt at once, either layout: bit-identical logits at every position. So
    a prefix reused from another chat, or a prompt cut by other chats' rows, never changes what greedy picks. (On
    Parley's CPU products; fp32 matrices go through torch's GEMM, whose rows may depend on the row count.)"""
    lm = load_model(tiny_models_q4[arch].gguf_path)
    ids = _prompts(lm.args.vocab_size)[-1]  # 61 tokens: past gemma3's window of 8
    whole = full_logits(lm, ids, chunk=len(ids))
    for layout, chunk in (("sequence", 1), ("sequence", 7), ("cell", 1), ("cell", 5), ("cell", len(ids))):
        assert torch.equal(full_logits(lm, ids, layout, chunk), whole), (layout, chunk)


def _step_until(batcher, seq, n_generated):
    while len(seq.generated) < n_generated:
        batcher.step()


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_fork_mid_answer(models, layout):
    lm = models["gemma3"]
    prompt = _prompts(lm.args.vocab_size)[3]
    params = SamplingParams(max_tokens=20)
    rt = make_runtime(lm, 4, _run(layout))
    b = rt.batcher
    other = Sequence(9, _prompts(lm.args.vocab_size)[5], SamplerState(params))
    a = Sequence(0, list(prompt), SamplerState(params))
    b.add(a)
    b.add(other)
    _step_until(b, a, 8)
    fork_point = list(a.token_ids)
    child = rt.fork(a, 1)  # a copy of a's cached tokens, a keeps running
    assert child.token_ids == fork_point[: a.num_cached]
    forced = (a.generated[-1] + 1) % lm.args.vocab_size  # the user edits the branch: a different token
    child.token_ids = fork_point + [forced]
    child.sampler = SamplerState(SamplingParams(max_tokens=12))
    rt.run(child)
    while b.has_work():
        b.step()
    assert a.generated == alone(lm, prompt, params, _run(layout))
    tail = alone(lm, fork_point + [forced], SamplingParams(max_tokens=12), _run(layout))
    assert child.generated == tail


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_rewind_and_regenerate(models, layout):
    lm = models["gemma3"]
    prompt = _prompts(lm.args.vocab_size)[2]
    params = SamplingParams(max_tokens=30)
    rt = make_runtime(lm, 2, _run(layout))
    b = rt.batcher
    a = Sequence(0, list(prompt), SamplerState(params))
    b.add(a)
    _step_until(b, a, 12)
    keep = len(prompt) + 5
    rt.keep_prefix(a, keep)  # an edit: the cache and the history go back to `keep` tokens
    assert a.num_cached == keep
    del a.generated[keep - len(prompt):], a.token_ids[keep:]
    edited = (a.token_ids[-1] + 3) % lm.args.vocab_size
    a.token_ids.append(edited)
    prefix = list(a.token_ids)
    start = len(a.generated)
    while b.has_work():
        b.step()
    fresh = alone(lm, prefix, SamplingParams(max_tokens=30 - start), _run(layout))
    assert a.generated[start:] == fresh


def test_rewind_below_ring_floor_is_refused(models):
    lm = models["gemma3"]
    prompt = _prompts(lm.args.vocab_size)[5]  # 61 tokens: the 15-row ring has wrapped
    rt = make_runtime(lm, 1, _run("sequence"))
    a = Sequence(0, list(prompt), SamplerState(SamplingParams(max_tokens=30)))
    rt.batcher.add(a)
    _step_until(rt.batcher, a, 2)
    with pytest.raises(CacheError, match="ring"):
        rt.cache.rewind(a.slot, 10)
    rt.keep_prefix(a, a.num_cached - 4)  # within the floor: allowed
    assert a.slot is not None
    rt.stop(a, "cancelled")
    rt.keep_prefix(a, 10)  # below it, between turns: the slot goes and the next turn prefills again
    assert a.slot is None and a.num_cached == 0


@pytest.mark.parametrize("weights", ["dequantized", "quantized"])
def test_cli_batched_equals_sequential(tiny_models_q4, tmp_path, capsys, weights):
    model = str(tiny_models_q4["qwen3"].gguf_path)
    prompts = ["Hello there", "def f(x):\n    return x", "1 2 3 4 5 6 7 8 9 10 11 12", "über naïve café", "a", "The end"]
    base = ["--data-dir", str(tmp_path), "generate", "--model", model, "--raw", "--json", "--max-tokens", "12",
            "--weights", weights]
    for p in prompts:
        base += ["--prompt", p]
    assert main(base) == 0
    *batched, loaded = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(base + ["--sequential"]) == 0
    *sequential, _ = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in batched] == list(range(len(prompts)))
    assert [(r["token_ids"], r["text"]) for r in batched] == [(r["token_ids"], r["text"]) for r in sequential]
    assert all(len(r["token_ids"]) > 0 for r in batched)
    for r in batched:  # the figures users compare with llama.cpp's
        assert r["ttft_s"] > 0 and r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0
        assert 0 < r["decode_steps"] <= r["completion_tokens"] and 0 <= r["accepted_tokens"] <= r["drafted_tokens"]
    assert loaded["load_s"] > 0 and loaded["resident_mb"] > 0
    held_quantized = any(fmt in loaded["quantization"] for fmt in ("→int4", "→blocks"))
    assert held_quantized == (weights == "quantized")
