"""Qwen2 / Qwen2.5: the Llama block with biases on the Q/K/V projections."""
from __future__ import annotations

from typing import Any

import torch

from engine.models import llama
from engine.models.args import ModelArgs

ARCH = "qwen2"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    return llama.args_from_hf(config, ARCH, attention_bias=True)


def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    return llama.args_from_gguf(meta, shapes, ARCH)


sanitize = llama.sanitize


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    return tensor  # NEOX rope: llama.cpp stores Q/K unpermuted
