"""OLMoE (OLMoE-1B-7B): Llama's block with OLMo 2's whole-projection q/k norms, 64 experts of which each token takes 8,
weighted by their softmax probabilities as they are (not renormalised)."""
from __future__ import annotations

from typing import Any

from engine.errors import UnsupportedModelError
from engine.models import llama, olmo2
from engine.models.args import ModelArgs, require

ARCH = "olmoe"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model
sanitize = llama.sanitize
gguf_fix = olmo2.gguf_fix  # NEOX rope: Q/K rows as HF has them


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    where = "config.json (olmoe)"
    if config.get("clip_qkv"):  # no released OLMoE clips; refused rather than silently unclipped
        raise UnsupportedModelError("OLMoE models that clip q/k/v (clip_qkv) are not supported.")
    return llama.args_from_hf(
        config, ARCH, qk_norm=True, qk_norm_whole=True, num_experts=require(config, "num_experts", where),
        experts_per_token=require(config, "num_experts_per_tok", where),
        moe_intermediate_size=require(config, "intermediate_size", where),
        norm_topk_prob=bool(config.get("norm_topk_prob", False)))


def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    # llama.cpp leaves OLMoE's expert weights unnormalised, as its config does
    return llama.args_from_gguf(meta, shapes, ARCH, qk_norm=True, qk_norm_whole=True, norm_topk_prob=False)
