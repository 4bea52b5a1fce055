"""GLM-4 (`glm4`, the 0414 models): four plain norms around attention and MLP, q/k/v biases, a fused gate/up, and a
rotary over the first half of each head in adjacent pairs. The shared checks (transformers, llama.cpp, quantized, MLX,
CUDA) are in test_arch_suite.py; they fail when the q/k rows are not reordered (checked)."""
from __future__ import annotations

import torch

from engine.models.args import GLOBAL
from engine.models.glm4 import args_from_hf, head_order, sanitize

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 300, "partial_rotary_factor": 0.5}


def test_half_of_each_head_rotates_in_halves():
    """An 8-dim head rotates dims 0-3 as pairs (0, 1) and (2, 3): they become (0, 4) and (1, 5) of the whole-head rotary,
    the unrotated dims 4-7 pair with each other."""
    args = args_from_hf(TINY)
    assert args.rope[GLOBAL].rotary_dim == 4 and args.attention_bias
    assert head_order(args).tolist() == [0, 2, 4, 5, 1, 3, 6, 7]


def test_glm_names_become_the_sandwich_blocks():
    args = args_from_hf(TINY)
    hf = {f"model.layers.0.{n}.weight": torch.ones(64) for n in
          ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm")}
    hf["model.layers.0.mlp.gate_up_proj.weight"] = torch.cat([torch.zeros(128, 64), torch.ones(128, 64)])
    out = sanitize(hf, args)
    assert {n.removeprefix("model.layers.0.").removesuffix(".weight") for n in out} == {
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
        "mlp.gate_proj", "mlp.up_proj"}
    assert out["model.layers.0.mlp.gate_proj.weight"].sum() == 0 and out["model.layers.0.mlp.up_proj.weight"].all()
