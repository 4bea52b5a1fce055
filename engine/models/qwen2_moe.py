"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention, routed experts plus one shared expert every token
takes, scaled by the sigmoid of its own gate; the routed weights as the softmax gave them."""
from __future__ import annotations

from typing import Any

import torch

from engine.models import llama, qwen3_moe
from engine.models.args import ModelArgs, require

ARCH = "qwen2moe"  # llama.cpp's name; transformers' is qwen2_moe
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model
sanitize = llama.sanitize


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    shared = require(config, "shared_expert_intermediate_size", "config.json (qwen2_moe)")
    return qwen3_moe.hf_args(config, "qwen2_moe", attention_bias=bool(config.get("qkv_bias", True)),
                             shared_expert_size=shared)


def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    shared = meta.get(f"{ARCH}.expert_shared_feed_forward_length") or shapes.get("blk.0.ffn_gate_shexp.weight",
                                                                                 (0,))[0]
    # llama.cpp leaves the routed weights unnormalised for this architecture, as transformers' config does
    return llama.args_from_gguf(meta, shapes, ARCH, norm_topk_prob=False, shared_expert_size=int(shared))


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    if name.endswith("ffn_gate_inp_shexp.weight") and tensor.dim() == 1:  # a file may hold the gate as a vector
        return tensor.reshape(1, -1)
    return tensor  # NEOX rope: Q/K rows as HF has them
