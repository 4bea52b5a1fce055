"""ERNIE 4.5 MoE (Baidu ERNIE-4.5-21B-A3B, 300B-A47B): ERNIE 4.5's attention (a rotary over adjacent pairs, reordered
at load: engine/models/ernie4_5.py) and, after the leading dense layers, routed experts: chosen by softmax plus a
per-expert bias (the choice only; the weights are the softmax's, renormalised), with shared experts every token takes,
added without a gate."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.models import ernie4_5, llama
from engine.models.args import ModelArgs, gguf_metadata_errors, positive, require

ARCH = "ernie4_5-moe"  # llama.cpp's name; transformers' is ernie4_5_moe
GGUF_BLOCK_NAMES = {**llama.GGUF_BLOCK_NAMES, "exp_probs_b": "mlp.select"}
Model = llama.Model
gguf_fix = ernie4_5.gguf_fix
# HF names -> this module's (the bias under transformers 5's name and the Hub's)
HF_NAMES = ((".mlp.gate.moe_statics.e_score_correction_bias", ".mlp.select.bias"),
            (".mlp.moe_statics.e_score_correction_bias", ".mlp.select.bias"),
            (".mlp.shared_experts.", ".mlp.shared_expert."))


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    where = "config.json (ernie4_5_moe)"
    if config.get("use_bias"):
        raise UnsupportedModelError("ERNIE 4.5 with biases on its projections (use_bias) is not supported.")
    n = int(require(config, "num_hidden_layers", where))
    start, end = config.get("moe_layer_start_index", 1), config.get("moe_layer_end_index", -1)
    step = config.get("moe_layer_interval", 1)
    if not all(isinstance(v, int) for v in (start, end, step)) or step < 1:
        raise UnsupportedModelError("ERNIE 4.5 MoE layer indices must be whole numbers (a vision model's lists are "
                                    "not supported).")
    end = n - 1 if end == -1 else end
    dense = [i for i in range(n) if not ((i + 1) % step == 0 and start <= i <= end)]
    inter = int(require(config, "moe_intermediate_size", where))
    return llama.args_from_hf(
        {"tie_word_embeddings": True, **config}, "ernie4_5_moe",
        num_experts=config.get("moe_num_experts", config.get("num_experts")),
        experts_per_token=config.get("moe_k", config.get("num_experts_per_tok")), moe_intermediate_size=inter,
        norm_topk_prob=True, dense_layers=dense, shared_expert_gated=False, expert_select_bias=True,
        shared_expert_size=inter * int(config.get("moe_num_shared_experts", 0)))


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    if "blk.0.attn_q.bias" in shapes:
        raise UnsupportedModelError("ERNIE 4.5 with biases on its projections is not supported.")
    base = llama.args_from_gguf(meta, shapes, ARCH)
    lead = int(meta.get(f"{ARCH}.leading_dense_block_count", 0))
    step = positive(meta.get(f"{ARCH}.interleave_moe_layer_step", 1), f"{ARCH}.interleave_moe_layer_step")
    dense = [i for i in range(base.num_layers) if i < lead or (i + 1) % step]  # llama.cpp's rule
    return replace(base, dense_layers=dense, shared_expert_gated=False, expert_select_bias=True)


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in ernie4_5.sanitize(weights, args).items():
        for hf, ours in HF_NAMES:
            name = name.replace(hf, ours)
        out[name] = tensor.reshape(-1) if name.endswith(".mlp.select.bias") else tensor
    return out
