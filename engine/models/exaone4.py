"""EXAONE 4.0 (LG AI Research): OLMo 2's block (each sublayer's output normed before its residual add) with q/k norms
per head. The 32B's hybrid attention slides over three layers of four, which alone rotate; the fourth attends to the
whole context without rotary positions (a NOPE layer kind). Without a sliding window (the 1.2B) every layer is global
and rotates. GGUF files keep the Q/K rows as HF has them (NEOX rotary)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.errors import UnsupportedModelError
from engine.models import llama, olmo2
from engine.models.args import (
    GLOBAL, NOPE, SLIDING, ModelArgs, RopeArgs, gguf_layer_kinds, gguf_metadata_errors, hf_layer_types, positive,
)

ARCH = "exaone4"
SLIDING_PERIOD = 4  # transformers' default sliding_window_pattern
GGUF_BLOCK_NAMES = olmo2.GGUF_BLOCK_NAMES
Block, Model, sanitize, gguf_fix = olmo2.Block, olmo2.Model, olmo2.sanitize, olmo2.gguf_fix


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    args = llama.args_from_hf({**config, "use_sliding_window": False}, ARCH, qk_norm=True)
    if not config.get("sliding_window"):
        return args
    pattern = config.get("sliding_window_pattern") or SLIDING_PERIOD
    if config.get("layer_types") or not isinstance(pattern, str):
        kinds = hf_layer_types({**config, "sliding_window_pattern": pattern}, args.num_layers)
    elif set(pattern) <= {"L", "G"}:  # "LLLG": L slides, G is global, repeated from layer 0
        kinds = [SLIDING if pattern[i % len(pattern)] == "L" else GLOBAL for i in range(args.num_layers)]
    else:
        raise UnsupportedModelError(f"The sliding window pattern {pattern!r} is not one of L and G per layer.")
    return _hybrid(args, kinds, config["sliding_window"])


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    args = llama.args_from_gguf(meta, shapes, ARCH)
    window = meta.get(f"{ARCH}.attention.sliding_window") or 0
    if not window:
        return args
    key = f"{ARCH}.attention.sliding_window_pattern"
    return _hybrid(args, gguf_layer_kinds(meta.get(key, SLIDING_PERIOD), args.num_layers, key), window)


def _hybrid(args: ModelArgs, kinds: list[str], window: Any) -> ModelArgs:
    rope = args.rope[GLOBAL]  # one object for the sliding kind: the loader fills a file's rope_freqs factors into it
    return replace(args, layer_types=[SLIDING if k == SLIDING else NOPE for k in kinds],
                   sliding_window=positive(window, "sliding window"),
                   rope={SLIDING: rope, NOPE: RopeArgs(rope.theta, rotary_dim=0)})


def gguf_rope_factors(name: str, args: ModelArgs) -> RopeArgs | None:
    """Where a file's rope_freqs (Llama 3 scaling) go: the rotating kind's rotary."""
    if name != "rope_freqs.weight":
        return None
    return args.rope[SLIDING] if SLIDING in args.rope else args.rope[GLOBAL]
