"""An eager CPU step's large logits go to one buffer the runner keeps across steps (no fresh pages each step: a
verify step of 8 sessions writes 62 MB of them), valid until the next step as a tape's are; nothing else changes."""
from __future__ import annotations

import pytest
import torch

import engine.runner as runner_module
from bench.runs import RunConfig, make_batcher
from engine.loading.loader import LoadOptions, load_model
from engine.quant.weight import blocks_available
from engine.sampling import SamplingParams
from tests.support.engine_helpers import run_staggered

pytestmark = pytest.mark.skipif(not blocks_available(), reason="the CPU library's products write into the buffer")


def _run(lm, prompts: list[list[int]]) -> list[list[int]]:
    batcher = make_batcher(lm, 4, RunConfig(max_seq_len=128, kv_layout="sequence"))
    return run_staggered(batcher, prompts, [0, 0, 1, 2], SamplingParams(max_tokens=10))


def test_eager_steps_write_their_logits_into_one_kept_buffer_and_decode_as_before(tiny_models_q8, monkeypatch):
    lm = load_model(tiny_models_q8["llama"].gguf_path, LoadOptions(weights="quantized"))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(6, lm.args.vocab_size, (n,), generator=g).tolist() for n in (30, 21, 40, 17)]
    fresh = _run(lm, prompts)
    monkeypatch.setattr(runner_module, "EAGER_LOGITS_BYTES", 0)  # every eager step takes the buffer
    seen = []
    run = runner_module.ModelRunner.run

    def watched(self, batch):
        logits, greedy = run(self, batch)
        seen.append(self._logits_buffer is not None and logits.data_ptr() == self._logits_buffer.data_ptr())
        return logits, greedy

    monkeypatch.setattr(runner_module.ModelRunner, "run", watched)
    assert _run(lm, prompts) == fresh
    assert any(seen)  # the eager steps (prefills here; a tape's logits are its own buffer's)
