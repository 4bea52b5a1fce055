"""Arcee (AFM-4.5B): the Llama block with an MLP without a gate, down(relu(up(x))²). llama.cpp's files permute the
Q/K rows as Llama's (engine/models/llama.py undoes it)."""
from __future__ import annotations

from typing import Any

from engine.errors import UnsupportedModelError
from engine.models import llama
from engine.models.args import ModelArgs, gguf_metadata_errors

ARCH = "arcee"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model, sanitize, gguf_fix = llama.Model, llama.sanitize, llama.gguf_fix


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    if config.get("mlp_bias") or config.get("attention_bias"):  # False in the released checkpoints
        raise UnsupportedModelError("Arcee with biases on its projections is not supported.")
    return llama.args_from_hf(config, ARCH, gated_mlp=False, hidden_act=config.get("hidden_act") or "relu2")


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    return llama.args_from_gguf(meta, shapes, ARCH, gated_mlp=False, hidden_act="relu2")
