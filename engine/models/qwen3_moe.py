"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): Qwen3's attention, experts for the MLP."""
from __future__ import annotations

from typing import Any

from engine.errors import UnsupportedModelError
from engine.models import llama, qwen3
from engine.models.args import ModelArgs, require

ARCH = "qwen3moe"  # llama.cpp's name; transformers' is qwen3_moe
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model
sanitize = llama.sanitize
gguf_fix = qwen3.gguf_fix


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    return hf_args(config, "qwen3_moe", qk_norm=True, attention_bias=bool(config.get("attention_bias", False)))


def hf_args(config: dict[str, Any], model_type: str, **overrides: Any) -> ModelArgs:
    """A Qwen MoE folder's ModelArgs: its experts, and the layers transformers gives a dense MLP."""
    where = f"config.json ({model_type})"
    n_layers = require(config, "num_hidden_layers", where)
    experts = config.get("num_experts", config.get("num_local_experts"))  # the Hub's key, transformers 5's
    if experts is None:
        raise UnsupportedModelError(f"{where} does not define 'num_experts'.")
    step = int(config.get("decoder_sparse_step") or 1)
    only = set(config.get("mlp_only_layers") or [])
    dense = [i for i in range(n_layers) if i in only or (i + 1) % step]  # transformers' rule for a layer's MLP
    return llama.args_from_hf(
        config, model_type, **overrides, num_experts=experts,
        experts_per_token=require(config, "num_experts_per_tok", where),
        moe_intermediate_size=require(config, "moe_intermediate_size", where),
        norm_topk_prob=bool(config.get("norm_topk_prob", False)), dense_layers=dense)


def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    if not meta.get(f"{ARCH}.expert_count"):
        raise UnsupportedModelError(f"The GGUF metadata does not define {ARCH}.expert_count.")
    return llama.args_from_gguf(meta, shapes, ARCH, qk_norm=True)
