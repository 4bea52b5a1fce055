"""ERNIE 4.5 dense (Baidu ERNIE-4.5-0.3B): the Llama block, whose rotary turns adjacent pairs of each head's dims
(GPT-J's order) in both HF folders and GGUF files; the loader reorders q/k rows into the half-split order the rotary
kernels use (attention scores do not depend on the order, only on q and k sharing it)."""
from __future__ import annotations

from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.models import llama
from engine.models.args import ModelArgs

ARCH = "ernie4_5"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model
gguf_fix = llama.gguf_fix  # llama.cpp keeps the adjacent pairs (its NORM rotary): the same reordering as Llama's


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    if config.get("use_bias"):  # False in the released dense checkpoints
        raise UnsupportedModelError("ERNIE 4.5 with biases on its projections (use_bias) is not supported.")
    return llama.args_from_hf({"tie_word_embeddings": True, **config}, ARCH)


def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    if "blk.0.attn_q.bias" in shapes:
        raise UnsupportedModelError("ERNIE 4.5 with biases on its projections is not supported.")
    return llama.args_from_gguf(meta, shapes, ARCH)


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    out = llama.sanitize(weights, args)
    for name, tensor in out.items():
        if name.endswith("self_attn.q_proj.weight"):
            out[name] = llama.unpermute(tensor, args.num_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            out[name] = llama.unpermute(tensor, args.num_kv_heads)
    return out
