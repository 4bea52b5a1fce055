"""A GGUF load builds the architecture's module once: the header's check builds it on the meta device for the shapes,
and build_model filled a second one (1.5 s of a 48-layer, 128-expert mixture's 4.7 s load). The file's rope factors,
read after that check, still make the rope tables."""
from __future__ import annotations

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from engine.models.layers import CausalLM, inv_freq


@pytest.mark.parametrize("weights", ["quantized", "dequantized"])
def test_a_gguf_load_builds_its_module_once(tiny_models, monkeypatch, weights):
    builds, real = [], CausalLM.__init__
    monkeypatch.setattr(CausalLM, "__init__", lambda model, *a, **k: builds.append(1) or real(model, *a, **k))
    lm = load_model(tiny_models["llama"].gguf_path, LoadOptions(weights=weights))
    assert len(builds) == 1
    assert all(rope.factors for rope in lm.args.rope.values())  # the tiny llama's rope_freqs
    for kind, rope in lm.args.rope.items():
        assert torch.equal(lm.model.rotary[kind].inv_freq, inv_freq(lm.args.head_dim, rope))
