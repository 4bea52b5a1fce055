"""Granite (IBM Granite 3.x dense): the Llama block with four scalars: embeddings multiplied, the attention scale
given outright, each block's attention and MLP outputs multiplied before their residual adds, logits divided."""
from __future__ import annotations

import math
from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.models import llama
from engine.models.args import ModelArgs, gguf_metadata_errors
from engine.models.layers import CausalLM, RMSNorm, add_and_norm

ARCH = "granite"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
sanitize = llama.sanitize
gguf_fix = llama.gguf_fix  # llama.cpp permutes Granite's Q/K rows as Llama's


class Block(llama.Block):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__(args, layer_id)
        self.residual_multiplier = args.residual_multiplier

    def forward(self, h: torch.Tensor, rope, cache, x: torch.Tensor | None = None,
                next_norm: RMSNorm | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        m = self.residual_multiplier  # on split-K partials too: their sum is scaled alike
        attn = self.self_attn(self.input_layernorm(h) if x is None else x, rope, cache)
        h, x = add_and_norm(h, attn * m, self.post_attention_layernorm)
        return add_and_norm(h, self.mlp(x) * m, next_norm)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args, [Block(args, i) for i in range(args.num_layers)])
        self.embed_scale = args.embedding_multiplier


def _scalars(embedding: Any, residual: Any, attention: Any, logits: Any) -> dict[str, Any]:
    # the attention multiplier is the scale itself: as a query_pre_attn_scalar, its inverse square
    attention = float(attention)
    if not 0 < attention < math.inf:
        raise UnsupportedModelError(f"Granite's attention multiplier must be a positive number, not {attention}.")
    return dict(embedding_multiplier=float(embedding), residual_multiplier=float(residual),
                query_pre_attn_scalar=attention ** -2, logits_scaling=float(logits))


def args_from_hf(config: dict[str, Any], arch: str = ARCH, **overrides: Any) -> ModelArgs:
    return llama.args_from_hf(config, arch, **_scalars(
        config.get("embedding_multiplier", 1.0), config.get("residual_multiplier", 1.0),
        config.get("attention_multiplier", 1.0), config.get("logits_scaling", 1.0)), **overrides)


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]], arch: str = ARCH) -> ModelArgs:
    def get(key: str) -> Any:
        return meta.get(f"{arch}.{key}", 1.0)

    return llama.args_from_gguf(meta, shapes, arch, **_scalars(
        get("embedding_scale"), get("residual_scale"), get("attention.scale"), get("logit_scale")))
