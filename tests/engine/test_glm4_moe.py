"""GLM-4.5 (`glm4_moe` folders, `glm4moe` files): what it adds to the mixture suite (test_moe.py checks it against
transformers, llama.cpp, quantized, MLX and CUDA): sigmoid scores with a selection bias and a scale, the partial
rotary with per-head q/k norms, and the next-token prediction layer left out."""
from __future__ import annotations

import gguf
import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.loading.loader import LoadOptions, load_model
from engine.models.glm4_moe import args_from_hf, gguf_skip, sanitize
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits
from tests.support.gguf_export import rewrite_gguf

pytestmark = pytest.mark.slow  # needs transformers

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 300, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "n_shared_experts": 1, "routed_scaling_factor": 2.5, "partial_rotary_factor": 0.5}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("glm4_moe"), "glm4_moe")


@pytest.mark.parametrize("source", [0, 1])  # the folder, its F32 GGUF
def test_both_sources_read_the_routing(files, source):
    args = load_model(files[source]).args
    assert args.dense_layers == [0] and args.router_sigmoid and args.expert_select_bias
    assert args.routed_scaling == 2.5 and args.shared_expert_size == 32 and not args.shared_expert_gated
    assert args.rope["global"].rotary_dim == 16 and args.qk_norm and args.attention_bias


def test_the_scale_and_the_sigmoid_matter(files):
    lm = load_model(files[1])
    want = full_logits(lm, check.prompt())
    for change in ("scaling", "sigmoid"):
        moes = [layer.mlp for layer in lm.model.model.layers[1:]]
        for moe in moes:
            setattr(moe, change, 1.0 if change == "scaling" else False)
        assert (full_logits(lm, check.prompt()) - want).abs().max() > 1e-2, change
        for moe in moes:
            setattr(moe, change, 2.5 if change == "scaling" else True)


def test_the_prediction_layer_is_left_out(files, tmp_path):
    """A file whose last block is a next-token prediction layer loads the blocks before it and skips its tensors; a
    folder's layer past num_hidden_layers is dropped."""
    path = rewrite_gguf(gguf.GGUFReader(files[1]), tmp_path / "nextn.gguf", extra={"glm4moe.nextn_predict_layers": 1})
    lm = load_model(path)
    assert lm.args.num_layers == 2 and len(lm.model.model.layers) == 2
    assert gguf_skip("blk.2.ffn_gate_exps.weight", lm.args) and not gguf_skip("blk.1.attn_q.weight", lm.args)
    args = args_from_hf(TINY)
    kept = sanitize({"model.layers.3.eh_proj.weight": torch.zeros(2, 2), "model.norm.weight": torch.ones(64)}, args)
    assert list(kept) == ["model.norm.weight"]


def test_the_router_stays_fp32_in_bf16(files):
    """A bf16 model's router and its bias are not rounded (as transformers keeps them): sigmoid scores a few
    thousandths apart still choose as in fp32; the bf16 model then runs near the fp32 one."""
    lm = load_model(files[1], LoadOptions(dtype="bfloat16", weights="dequantized"))
    moe = lm.model.model.layers[1].mlp
    assert moe.select.bias.dtype == torch.float32 and moe.gate.weight.dtype == torch.float32
    assert moe.experts[0].gate_proj.weight.dtype == torch.bfloat16
    exact = full_logits(load_model(files[1]), check.prompt())
    assert (full_logits(lm, check.prompt()).float() - exact).abs().max() < 0.08 * exact.abs().max()


def test_group_limited_routing_is_refused():
    with pytest.raises(UnsupportedModelError, match="expert groups"):
        args_from_hf({**TINY, "n_group": 8, "topk_group": 4})
