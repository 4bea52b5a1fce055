"""The MLX backend against the PyTorch one: logits, greedy tokens, batch invariance, the engine on MLX."""
import dataclasses
import gc
import weakref

import pytest
import torch

from engine import events as ev
from bench.runs import RunConfig, make_batcher, make_runtime
from engine.loading.loader import LoadOptions, build_model, load_model
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.support.engine_client import Client
from tests.support.engine_helpers import run_staggered
from tests.support.tiny_models import ARCHS

pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")

LENGTHS, ARRIVALS = [3, 9, 17, 30, 45, 61], [0, 0, 1, 2, 4, 7]


def _run(backend: str) -> RunConfig:
    return RunConfig(kv_layout="sequence", max_seq_len=128, step_tokens=16, chunk_tokens=8, backend=backend)


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(6, vocab, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.fixture
def models(tiny_models):
    """Loaded per test: running one on MLX releases its torch copy (engine/mlx_backend/quantized.held_in_mlx)."""
    return {arch: load_model(tiny_models[arch].gguf_path, LoadOptions(weights="dequantized")) for arch in ARCHS}


def _logits(lm, ids: list[int], backend: str) -> torch.Tensor:
    b = make_batcher(lm, 1, RunConfig(max_seq_len=len(ids) + 8, step_tokens=16, chunk_tokens=8, backend=backend))
    slot, out = b.cache.seq_new(), []
    from engine.step import StepBatch

    for start in range(0, len(ids), 8):
        n = min(8, len(ids) - start)
        segs = b.cache.declare_step([(slot, n)])
        batch = StepBatch(torch.tensor(ids[start : start + n]), torch.arange(start, start + n), segs, torch.arange(n),
                          [], [])
        b.runner.max_sampled_rows = n
        out.append(b.runner.run(batch)[0])
        b.cache.commit_step()
    return torch.cat(out)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_torch(models, arch):
    lm = models[arch]
    ids = _prompts(lm.args.vocab_size)[4]  # 45 tokens: crosses gemma3's ring of 15 rows
    on_torch = _logits(lm, ids, "torch")  # first: the MLX run releases the torch copy
    torch.testing.assert_close(_logits(lm, ids, "mlx"), on_torch, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_and_batch_invariance(models, arch):
    assert_greedy_matches_torch(models[arch], 16)


def assert_greedy_matches_torch(lm, max_tokens: int, then=None) -> None:
    """Greedy on MLX: batched == alone, and the PyTorch backend's tokens (staggered arrivals). `then`: a check on MLX
    to run once torch's tokens are in."""
    prompts, params = _prompts(lm.args.vocab_size), SamplingParams(max_tokens=max_tokens)
    on_torch = run_staggered(make_batcher(lm, 6, _run("torch")), prompts, ARRIVALS, params)
    if then is not None:
        then()
    batched = run_staggered(make_batcher(lm, 6, _run("mlx")), prompts, ARRIVALS, params)
    alone = [run_staggered(make_batcher(lm, 1, _run("mlx")), [p], [0], params)[0] for p in prompts]
    assert batched == alone
    assert batched == on_torch


def assert_mlx_matches_torch(lm) -> None:
    """MLX's logits over 45 tokens (past a tiny model's sliding window) are PyTorch's; greedy as above. Every torch
    run comes first: the first MLX run releases the torch copy."""
    ids = _prompts(lm.args.vocab_size)[4]
    on_torch = _logits(lm, ids, "torch")
    assert_greedy_matches_torch(lm, 12, then=lambda: torch.testing.assert_close(
        _logits(lm, ids, "mlx"), on_torch, atol=2e-4, rtol=1e-4))


def test_engine_on_mlx(tiny_models):
    c = Client(EngineConfig(max_sessions=2, max_session_tokens=256, step_tokens=32, chunk_tokens=16, backend="mlx"))
    with c.engine:
        model = c.load(tiny_models["gemma3"].gguf_path)
        loaded = c.wait_for(lambda e: isinstance(e, ev.ModelLoaded) and e.model_id == model)
        assert loaded.info["backend"] == "mlx"
        sids = [c.open(model, params=SamplingParams(max_tokens=8)) for _ in range(3)]
        turns = [c.send(s, f"hello {i}") for i, s in enumerate(sids)]  # 3 sessions, 2 slots
        ends = [c.wait(t) for t in turns]
        assert all(e.reason in ("stop", "length") for e in ends)
        follow = c.ask(sids[2], "and then?")  # the last to run: no waiting chat evicted its cache
        assert follow.stats.prefilled_tokens < follow.stats.prompt_tokens


@pytest.mark.slow
def test_embedded_gemma_on_mlx_matches_torch(gemma_lm):
    tok = gemma_lm.tokenizer
    prompts = [tok.encode(p, add_bos=True) for p in ["The capital of France is", "def fibonacci(n):", "Hello"]]
    params = SamplingParams(max_tokens=12)
    run = RunConfig(max_seq_len=256, backend="torch")
    on_torch = run_staggered(make_batcher(gemma_lm, 3, run), prompts, [0, 1, 1], params)
    ids = prompts[1]
    last_on_torch = _logits(gemma_lm, ids, "torch")[-1]
    # a copy: the MLX run releases the torch weights, and the session's other tests use gemma_lm's
    lm = dataclasses.replace(gemma_lm, model=build_model(gemma_lm.args, gemma_lm.model.float_state_dict(),
                                                         torch.float32, "cpu"))
    run.backend = "mlx"
    on_mlx = run_staggered(make_batcher(lm, 3, run), prompts, [0, 1, 1], params)
    assert on_mlx == on_torch
    gap = (_logits(lm, ids, "mlx")[-1] - last_on_torch).abs().max().item()
    assert gap < 2e-3, gap


def test_a_float_model_on_mlx_is_held_once(tiny_models):
    """A float model's torch copy is released once MLX holds its twin (it stayed beside it: the embedded Gemma
    dequantized took +1,036 MB resident), and later runtimes of the same loaded model reuse the twin."""
    lm = load_model(tiny_models["llama"].gguf_path, LoadOptions(weights="dequantized"))
    weight_bytes = lm.weight_bytes()
    torch_tensors = [weakref.ref(t) for t in [*lm.model.parameters(), *lm.model.buffers()]]
    runtime = make_runtime(lm, 2, _run("mlx"))
    gc.collect()
    assert all(r() is None for r in torch_tensors)
    assert runtime.info()["weights_mb"] == round(weight_bytes / 1e6, 1)
    assert make_runtime(lm, 1, _run("mlx")).batcher.runner.model is runtime.batcher.runner.model


EXIT_AFTER_AN_ANSWER = """
import sys
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.support.engine_client import Client

c = Client(EngineConfig(max_sessions=1, max_session_tokens=128, backend="mlx"))
with c.engine:
    c.ask(c.open(c.load(sys.argv[1]), params=SamplingParams(max_tokens=4)), "hi")
    sys.setswitchinterval(100)  # from the shutdown's wait on, this thread keeps the interpreter until it exits
"""


def test_a_process_that_ran_mlx_exits_cleanly(tiny_models):
    """`parley generate --backend mlx` answered, then aborted at exit ('terminate called without an active
    exception', 134) in 8 of 10 runs: the engine thread's end freed MLX's compiled activations (a per-thread cache)
    by taking the GIL from an interpreter already exiting. The switch interval makes that order certain here."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", EXIT_AFTER_AN_ANSWER, str(tiny_models["gemma3"].gguf_path)],
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stderr) == (0, "")
