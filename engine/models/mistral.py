"""Mistral folders (Mistral 7B, Mistral NeMo, Mistral Small 3): the Llama block, with Mixtral's rule for a sliding
window. llama.cpp's files of these models say "llama" (engine/models/llama.py reads them)."""
from __future__ import annotations

from typing import Any

from engine.models import llama, mixtral
from engine.models.args import ModelArgs

ARCH = "mistral"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model
sanitize = llama.sanitize
args_from_gguf = llama.args_from_gguf
gguf_fix = llama.gguf_fix


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    return mixtral.every_layer_slides(llama.args_from_hf(config, ARCH), config)
