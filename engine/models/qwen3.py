"""Qwen3 (dense): the Llama block with per-head RMSNorm on queries and keys, no biases."""
from __future__ import annotations

from typing import Any

import torch

from engine.models import llama
from engine.models.args import ModelArgs

ARCH = "qwen3"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    return llama.args_from_hf(config, ARCH, qk_norm=True, attention_bias=bool(config.get("attention_bias", False)))


def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    return llama.args_from_gguf(meta, shapes, ARCH)


sanitize = llama.sanitize


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    return tensor  # NEOX rope: llama.cpp stores Q/K unpermuted
