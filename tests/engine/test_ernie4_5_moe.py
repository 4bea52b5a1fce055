"""ERNIE 4.5 MoE (`ernie4_5_moe` folders, `ernie4_5-moe` files): what it adds to the mixture suite (test_moe.py, which
checks it against transformers, llama.cpp, quantized, MLX and CUDA): the leading dense layers, the selection bias and
the ungated shared experts."""
from __future__ import annotations

import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.loading.loader import load_model
from engine.models.ernie4_5_moe import args_from_hf
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300, "moe_num_experts": 8, "moe_k": 2,
        "moe_intermediate_size": 32, "moe_num_shared_experts": 2}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("ernie4_5_moe"), "ernie4_5_moe")


@pytest.mark.parametrize("source", [0, 1])  # the folder, its F32 GGUF
def test_both_sources_read_the_layout(files, source):
    args = load_model(files[source]).args
    assert args.dense_layers == [0] and args.expert_select_bias and not args.shared_expert_gated
    assert args.shared_expert_size == 64 and (args.num_experts, args.experts_per_token) == (8, 2)


def test_the_selection_bias_matters(files):
    """Without it (every expert's bias 0) other experts are chosen: other logits, so the checks against transformers
    and llama.cpp could not pass by ignoring it."""
    lm = load_model(files[1])
    biased = full_logits(lm, check.prompt())
    for layer in lm.model.model.layers[1:]:
        layer.mlp.select.bias.data.zero_()
    assert (full_logits(lm, check.prompt()) - biased).abs().max() > 1e-2


@pytest.mark.parametrize("layout", [dict(moe_layer_start_index=1, moe_layer_interval=1),
                                    dict(moe_layer_start_index=2, moe_layer_interval=2, moe_layer_end_index=4),
                                    dict(moe_layer_start_index=0, moe_layer_interval=3)])
def test_sparse_layers_as_transformers_builds_them(layout):
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeSparseMoeBlock

    config = {**TINY, **layout}
    model = Ernie4_5_MoeForCausalLM(Ernie4_5_MoeConfig(**config))
    sparse = [isinstance(layer.mlp, Ernie4_5_MoeSparseMoeBlock) for layer in model.model.layers]
    assert [args_from_hf(config).sparse_layer(i) for i in range(6)] == sparse and any(sparse)


def test_a_vision_models_layer_lists_are_refused():
    with pytest.raises(UnsupportedModelError, match="whole numbers"):
        args_from_hf({**TINY, "moe_layer_start_index": [1, 1]})
