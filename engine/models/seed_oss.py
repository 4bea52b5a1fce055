"""Seed-OSS (ByteDance Seed-OSS-36B): the Llama block with biases on the Q/K/V projections; llama.cpp names the norm
before the MLP post_attention_norm. GGUF files keep the Q/K rows as HF has them (NEOX rotary)."""
from __future__ import annotations

from typing import Any

from engine.errors import UnsupportedModelError
from engine.models import llama, qwen2
from engine.models.args import ModelArgs

ARCH = "seed_oss"
GGUF_BLOCK_NAMES = {**llama.GGUF_BLOCK_NAMES, "post_attention_norm": "post_attention_layernorm"}
Model, sanitize, gguf_fix = llama.Model, llama.sanitize, qwen2.gguf_fix


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    for key in ("attention_out_bias", "mlp_bias"):  # False in every released checkpoint
        if config.get(key):
            raise UnsupportedModelError(f"Seed-OSS with {key} set is not supported.")
    return llama.args_from_hf(config, ARCH, attention_bias=bool(config.get("attention_bias", True)))


def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    if "blk.0.attn_output.bias" in shapes:
        raise UnsupportedModelError("Seed-OSS with a bias on the attention output is not supported.")
    return llama.args_from_gguf(meta, shapes, ARCH)
