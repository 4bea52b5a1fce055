"""StableLM 2 (`stablelm`): what it adds to the shared checks (test_architectures.py): LayerNorms with a bias, a quarter
of each head rotated, blocks side by side when the model says so; the 12B's q/k norms refused."""
from __future__ import annotations

import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.loading.loader import load_model
from engine.models.args import GLOBAL
from engine.models.partial_rotary import partial_rotary_order
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits
from tests.support.tiny_models import make_tiny_hf

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def stablelm(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("stablelm"), "stablelm")


def test_both_sources_read_the_partial_rotary_and_the_biases(stablelm):
    for path in stablelm[:2]:
        lm = load_model(path)
        assert lm.args.rope[GLOBAL].rotary_dim == 4 and not lm.args.parallel_residual
        assert lm.model.model.norm.bias is not None and lm.model.model.layers[0].self_attn.q_proj.bias is not None


def test_each_feature_moves_the_logits(stablelm):
    """Checked against transformers and llama.cpp in test_architectures.py; here each one is shown to matter."""
    lm = load_model(stablelm[1])
    exact = full_logits(lm, check.prompt())
    norms = [m for m in lm.model.modules() if type(m).__name__ == "LayerNorm"]
    biases = [n.bias.data.clone() for n in norms]
    for n in norms:
        n.bias.data.zero_()
    assert (full_logits(lm, check.prompt()) - exact).abs().max() > 1e-2
    for n, b in zip(norms, biases):
        n.bias.data = b
    back = torch.argsort(partial_rotary_order(lm.args.head_dim, 4))  # q/k rows as the file stores them
    for layer in lm.model.model.layers:
        attn = layer.self_attn
        for proj, heads in ((attn.q_proj, attn.n_heads), (attn.k_proj, attn.n_kv)):
            proj.weight.data = proj.weight.data.reshape(heads, attn.head_dim, -1)[:, back].reshape(proj.weight.shape)
            proj.bias.data = proj.bias.data.reshape(heads, attn.head_dim)[:, back].reshape(-1)
    assert (full_logits(lm, check.prompt()) - exact).abs().max() > 1e-2


def test_side_by_side_blocks_match_transformers_and_llama_cpp(tmp_path):
    hf, f32 = check.tiny_files(tmp_path, "stablelm", config={"use_parallel_residual": True})[:2]
    for source in (hf, f32):
        lm = check.assert_matches_transformers(hf, source, "sequence")
        assert lm.args.parallel_residual and lm.model.model.layers[0].post_attention_layernorm is None
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(f32)
    assert (got - want).abs().max() < 1e-3 * max(5.0, float(want.abs().max()))


def test_the_12b_is_refused_in_one_line(tmp_path):
    with pytest.raises(UnsupportedModelError, match="StableLM 2 12B"):
        load_model(make_tiny_hf("stablelm", tmp_path / "hf", config={"qk_layernorm": True}))
