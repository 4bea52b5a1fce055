"""StarCoder 2 (`starcoder2`): what it adds to the shared checks (test_architectures.py): biases on every projection
and norm, an MLP without a gate, and the HF config's sliding window (which llama.cpp's files do not hold)."""
from __future__ import annotations

import pytest

from engine.loading.loader import load_model
from engine.models.args import SLIDING
from engine.models.layers import MLP
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers


def test_the_biases_and_the_ungated_mlp_matter(tmp_path):
    lm = load_model(check.tiny_files(tmp_path, "starcoder2")[1])
    assert all(isinstance(layer.mlp, MLP) for layer in lm.model.model.layers)
    exact = full_logits(lm, check.prompt())
    for layer in lm.model.model.layers:  # o_proj and down_proj without their biases
        layer.self_attn.o_proj.bias.data.zero_()
        layer.mlp.down_proj.bias.data.zero_()
    assert (full_logits(lm, check.prompt()) - exact).abs().max() > 1e-2


def test_the_hf_sliding_window_covers_every_layer(tmp_path):
    hf = check.tiny_files(tmp_path, "starcoder2", config={"sliding_window": 8})[0]  # crossed by the 21-token prompt
    lm = check.assert_matches_transformers(hf, hf, "sequence")
    assert lm.args.layer_types == [SLIDING] * lm.args.num_layers and lm.args.sliding_window == 8
    check.assert_matches_transformers(hf, hf, "cell")
