"""GLM-4.5 / GLM-4.6 (`glm4_moe`; GGUF `glm4moe`: GLM-4.5-Air 106B-A12B, GLM-4.5 355B-A32B): the Llama block with q/k/v
biases, optional per-head q/k norms and a rotary over the first half of each head (half-split, so only the partial
rotary's reordering: engine/models/partial_rotary.py), and after the leading dense layers, routed experts: each
expert's sigmoid score, the top k chosen by score + a per-expert bias, weighted by the scores renormalised and scaled,
plus shared experts added without a gate. The checkpoints' next-token prediction layer (the last block in HF folders
and GGUF files) is not run, so it is not loaded."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.models import llama, partial_rotary
from engine.models.args import GLOBAL, ModelArgs, gguf_metadata_errors, require
from engine.models.partial_rotary import rotary_rows

ARCH = "glm4moe"  # llama.cpp's name; transformers' is glm4_moe
# llama.cpp names the norm before the MLP post_attention_norm here
GGUF_BLOCK_NAMES = {**llama.GGUF_BLOCK_NAMES, "exp_probs_b": "mlp.select",
                    "post_attention_norm": "post_attention_layernorm"}
Model = llama.Model
SIGMOID_GATING = 2  # llama.cpp's expert_gating_func for sigmoid scores
HF_NAMES = ((".mlp.gate.e_score_correction_bias", ".mlp.select.bias"), (".mlp.shared_experts.", ".mlp.shared_expert."))


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    where = "config.json (glm4_moe)"
    heads = require(config, "num_attention_heads", where)
    head_dim = config.get("head_dim") or require(config, "hidden_size", where) // heads
    groups, chosen_groups = int(config.get("n_group") or 1), int(config.get("topk_group") or 1)
    if chosen_groups < groups:  # DeepSeek-V3's group-limited routing; every GLM-4.5 has one group
        raise UnsupportedModelError(f"Routing within {chosen_groups} of {groups} expert groups is not supported.")
    inter = int(require(config, "moe_intermediate_size", where))
    return llama.args_from_hf(
        config, "glm4_moe", attention_bias=bool(config.get("attention_bias", False)),
        qk_norm=bool(config.get("use_qk_norm", False)),
        rope={GLOBAL: partial_rotary.hf_partial_rope(config, head_dim, "GLM-4.5", 0.5)},
        num_experts=config.get("n_routed_experts", config.get("num_local_experts")),
        experts_per_token=require(config, "num_experts_per_tok", where), moe_intermediate_size=inter,
        norm_topk_prob=bool(config.get("norm_topk_prob", True)),
        dense_layers=list(range(int(config.get("first_k_dense_replace", 1)))),
        shared_expert_size=inter * int(config.get("n_shared_experts", 1)), shared_expert_gated=False,
        expert_select_bias=True, router_sigmoid=True, routed_scaling=float(config.get("routed_scaling_factor", 1.0)))


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    def get(key: str, default: Any) -> Any:
        return meta.get(f"{ARCH}.{key}", default)

    base = llama.args_from_gguf(meta, shapes, ARCH)
    n = base.num_layers - int(get("nextn_predict_layers", 0))  # block_count counts the prediction layers
    if n < 1:
        raise UnsupportedModelError(f"The file's {base.num_layers} blocks are all next-token prediction layers.")
    if int(get("expert_gating_func", SIGMOID_GATING)) != SIGMOID_GATING:
        raise UnsupportedModelError("GLM-4.5 files whose experts are scored by a softmax are not supported.")
    base = partial_rotary.partial(base, float(get("rope.dimension_count", base.head_dim // 2)) / base.head_dim,
                                  "GLM-4.5")
    return replace(
        base, num_layers=n, layer_types=base.layer_types[:n],
        dense_layers=list(range(int(get("leading_dense_block_count", 1)))),
        norm_topk_prob=bool(get("expert_weights_norm", True)), routed_scaling=float(get("expert_weights_scale", 1.0)),
        shared_expert_gated=False, expert_select_bias=True, router_sigmoid=True)


def _layer(name: str) -> int | None:
    parts = name.split(".")
    if parts[0] == "blk":
        return int(parts[1])
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None


def gguf_skip(name: str, args: ModelArgs) -> bool:
    """The next-token prediction layers' tensors (blocks past the model's layers)."""
    return (_layer(name) or 0) >= args.num_layers


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in llama.sanitize(weights, args).items():
        if (_layer(name) or 0) >= args.num_layers:
            continue  # the next-token prediction layer
        for hf, ours in HF_NAMES:
            name = name.replace(hf, ours)
        if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
            tensor = rotary_rows(tensor, args.num_heads, args)
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            tensor = rotary_rows(tensor, args.num_kv_heads, args)
        elif name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):  # per head: its dims move alike
            tensor = rotary_rows(tensor, 1, args)
        out[name] = tensor.reshape(-1) if name.endswith(".mlp.select.bias") else tensor
    return out


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    if name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
        return rotary_rows(tensor, 1, args)
    return partial_rotary.gguf_fix(name, tensor, args)
