"""Cohere (`cohere`, GGUF `command-r`) and Cohere 2 (`cohere2`): what they add to the shared checks
(test_architectures.py): a centred LayerNorm feeding attention and the MLP side by side, interleaved rotary pairs, a
logit scale; Cohere 2's sliding layers with rotary positions and global ones without; Command-R+'s q/k norms refused."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.loading.loader import load_model
from engine.models import llama
from engine.models.args import NOPE, SLIDING
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def cohere(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("cohere"), "cohere")


def test_both_sources_read_the_scale_and_the_norm(cohere):
    for path in cohere[:2]:
        args = load_model(path).args
        assert args.model_type == "cohere" and args.tie_word_embeddings
        assert args.logits_scaling == pytest.approx(4.0) and args.rms_norm_eps == pytest.approx(1e-4)


def test_each_feature_moves_the_logits(cohere):
    """Checked against transformers and llama.cpp in test_architectures.py; here each one is shown to matter."""
    lm = load_model(cohere[1])
    exact = full_logits(lm, check.prompt())
    layers = lm.model.model.layers
    norm_forward = type(layers[0].input_layernorm).forward
    try:  # an RMSNorm (no centring) in place of the LayerNorm
        type(layers[0].input_layernorm).forward = lambda self, x: self.weight * (x * torch.rsqrt(
            x.pow(2).mean(-1, keepdim=True) + self.eps))
        assert (full_logits(lm, check.prompt()) - exact).abs().max() > 1e-2
    finally:
        type(layers[0].input_layernorm).forward = norm_forward
    for layer in layers:  # q/k rows left interleaved: the rotary pairs the wrong dims
        attn = layer.self_attn
        attn.q_proj.weight.data = _interleaved(attn.q_proj.weight.data, attn.n_heads)
        attn.k_proj.weight.data = _interleaved(attn.k_proj.weight.data, attn.n_kv)
    assert (full_logits(lm, check.prompt()) - exact).abs().max() > 1e-2


def _interleaved(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of llama.unpermute: the rows as the file stores them."""
    shape = w.shape
    out = w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).transpose(1, 2).reshape(shape)
    assert torch.equal(llama.unpermute(out, n_head), w)
    return out


@pytest.mark.parametrize("key, value, words", [
    ("command-r.logit_scale", 0.0, "logit scale must be a positive number"),
    ("command-r.logit_scale", float("nan"), "logit scale must be a positive number"),
])
def test_bad_metadata_is_refused_in_one_line(cohere, tmp_path, key, value, words):
    check.assert_refused(cohere[1], tmp_path, key, value, words)


def test_command_r_plus_is_refused_in_one_line(tmp_path):
    from tests.support.tiny_models import make_tiny_hf

    with pytest.raises(UnsupportedModelError, match="Command-R\\+"):
        load_model(make_tiny_hf("cohere", tmp_path / "hf", config={"use_qk_norm": True}))


def test_cohere2_slides_with_rotary_and_attends_globally_without(tmp_path):
    hf, f32 = check.tiny_files(tmp_path, "cohere2")[:2]
    for path in (hf, f32):
        args = load_model(path).args
        assert args.layer_types == [SLIDING, SLIDING, SLIDING, NOPE, SLIDING] and args.sliding_window == 8
    lm = load_model(f32)
    exact = full_logits(lm, check.prompt())
    with_rope = replace(lm.args, rope={**lm.args.rope, NOPE: lm.args.rope[SLIDING]})
    lm.model.args = with_rope
    lm.model.reset_buffers("cpu")  # the global layer now rotates
    assert (full_logits(lm, check.prompt()) - exact).abs().max() > 1e-2
