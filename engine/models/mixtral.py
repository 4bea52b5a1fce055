"""Mixtral (8x7B, 8x22B) and Mistral-style MoE folders: Llama's attention, eight experts for the MLP.
llama.cpp's files of these models say "llama" (engine/models/llama.py reads their experts)."""
from __future__ import annotations

from typing import Any

import torch

from engine.models import llama
from engine.models.args import GLOBAL, SLIDING, ModelArgs, require

ARCH = "mixtral"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model
args_from_gguf = llama.args_from_gguf
gguf_fix = llama.gguf_fix
# Mixtral's own names -> the shared ones (w1 the gate, w3 the up projection, w2 down)
RENAMES = ((".block_sparse_moe.gate.", ".mlp.gate."), (".block_sparse_moe.experts.", ".mlp.experts."),
           (".w1.", ".gate_proj."), (".w2.", ".down_proj."), (".w3.", ".up_proj."))


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    where = "config.json (mixtral)"
    return every_layer_slides(llama.args_from_hf(
        config, ARCH, num_experts=require(config, "num_local_experts", where),
        experts_per_token=require(config, "num_experts_per_tok", where),
        moe_intermediate_size=require(config, "intermediate_size", where), norm_topk_prob=True), config)


def every_layer_slides(args: ModelArgs, config: dict[str, Any]) -> ModelArgs:
    """transformers' Mistral and Mixtral: every layer attends to the last `sliding_window` keys when the config has
    one (Mistral 7B v0.1: 4,096), to all of them otherwise."""
    if config.get("sliding_window"):
        args.layer_types = [SLIDING] * args.num_layers
        args.sliding_window = int(config["sliding_window"])
        args.rope[SLIDING] = args.rope[GLOBAL]
    return args


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in llama.sanitize(weights, args).items():
        if ".block_sparse_moe." in name:
            for old, new in RENAMES:
                name = name.replace(old, new)
        out[name] = tensor
    return out
