"""Cohere 2 (Command-R7B, Command A): Cohere's parallel block, with three sliding-window layers of every four, which
alone take rotary positions; the fourth attends to the whole context without them (a NOPE layer kind)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.errors import UnsupportedModelError
from engine.models import cohere, llama
from engine.models.args import (
    GLOBAL, NOPE, SLIDING, ModelArgs, RopeArgs, gguf_metadata_errors, hf_layer_types, positive,
)

ARCH = "cohere2"
SLIDING_PATTERN = 4  # llama.cpp hard-codes it; transformers' default layer_types
GGUF_BLOCK_NAMES = cohere.GGUF_BLOCK_NAMES
gguf_fix = cohere.gguf_fix
sanitize = cohere.sanitize
Model = cohere.Model


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    if not config.get("sliding_window"):
        raise UnsupportedModelError("This Cohere 2 model has no sliding window.")
    n = int(config["num_hidden_layers"])
    args = cohere.args_from_hf({**config, "use_sliding_window": False}, ARCH)
    kinds = hf_layer_types({"sliding_window_pattern": SLIDING_PATTERN, **config}, n)
    return _windowed(args, kinds, config["sliding_window"])


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    args = cohere.args_from_gguf(meta, shapes, ARCH)
    kinds = [SLIDING if (i + 1) % SLIDING_PATTERN else NOPE for i in range(args.num_layers)]
    return _windowed(args, kinds, meta.get(f"{ARCH}.attention.sliding_window"))


def _windowed(args: ModelArgs, kinds: list[str], window: Any) -> ModelArgs:
    window = positive(window, "sliding window")
    rope = args.rope[GLOBAL]
    return replace(args, layer_types=[k if k == SLIDING else NOPE for k in kinds], sliding_window=window,
                   rope={SLIDING: rope, NOPE: RopeArgs(rope.theta, rotary_dim=0)})
