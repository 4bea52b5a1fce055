"""Granite 4.0 without Mamba layers (`granitemoehybrid` folders; llama.cpp writes them as `granite` or `granitemoe`
files): the dense "shared" MLP (test_arch_suite.py's checks), experts beside an ungated shared expert, a model without
rotary positions, and Granite 4.0-H's Mamba-2 layers refused."""
from __future__ import annotations

import pytest

from engine.errors import UnsupportedModelError
from engine.loading.loader import load_model
from engine.models import granitemoehybrid
from engine.models.args import NOPE
from tests.support import arch_checks as check

pytestmark = pytest.mark.slow  # needs transformers

EXPERTS = {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32, "shared_intermediate_size": 64}


def test_experts_beside_the_shared_mlp(tmp_path):
    """The folder, its granitemoe GGUF (the shared MLP as ffn_*_shexp) and llama.cpp agree."""
    hf, f32 = check.tiny_files(tmp_path, "granitemoehybrid", config=EXPERTS)[:2]
    for source in (hf, f32):
        lm = check.assert_matches_transformers(hf, source, "sequence")
        assert lm.args.num_experts == 8 and lm.args.shared_expert_size == 64 and not lm.args.shared_expert_gated
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(f32)
    assert (got - want).abs().max() < 2e-3 * max(5.0, float(want.abs().max())), (got - want).abs().max()


def test_without_rotary_positions(tmp_path):
    hf = check.tiny_files(tmp_path, "granitemoehybrid", config={"position_embedding_type": None})[0]
    lm = check.assert_matches_transformers(hf, hf, "sequence")
    assert lm.args.layer_types == [NOPE, NOPE]
    assert load_model(check.tiny_files(tmp_path / "rope", "granitemoehybrid")[0]).args.layer_types == ["global"] * 2


def test_mamba_layers_are_refused():
    config = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "vocab_size": 300, "shared_intermediate_size": 128, "layer_types": ["mamba", "attention"]}
    with pytest.raises(UnsupportedModelError, match="Mamba-2"):
        granitemoehybrid.args_from_hf(config)
    with pytest.raises(UnsupportedModelError, match="Mamba-2"):
        granitemoehybrid.args_from_gguf({"granitehybrid.attention.head_count_kv": [0, 2]}, {})
