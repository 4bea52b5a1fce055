"""SmolLM3: the Llama block, with every fourth layer attending without rotary positions (NoPE). Those layers are a
layer kind of their own whose rotary has frequency 0 everywhere (cos 1, sin 0: q and k pass unchanged), so every
backend's rotary kernels serve them as they are."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.errors import UnsupportedModelError
from engine.models import llama
from engine.models.args import GLOBAL, NOPE, ModelArgs, RopeArgs, gguf_metadata_errors

ARCH = "smollm3"
NO_ROPE_STEP = 4  # llama.cpp hard-codes it for smollm3; transformers' default no_rope_layer_interval
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model
sanitize = llama.sanitize
gguf_fix = llama.gguf_fix  # llama.cpp permutes SmolLM3's Q/K rows as Llama's


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    if config.get("use_sliding_window") and config.get("sliding_window"):
        raise UnsupportedModelError("SmolLM3 with a sliding window is not supported (no released model has one).")
    n = int(config["num_hidden_layers"])
    uses = config.get("no_rope_layers") or _every_step(n, int(config.get("no_rope_layer_interval") or NO_ROPE_STEP))
    if len(uses) != n:
        raise UnsupportedModelError(f"no_rope_layers lists {len(uses)} layers but the model has {n}.")
    return _without_rope(llama.args_from_hf(config, ARCH), [bool(u) for u in uses])


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    args = llama.args_from_gguf(meta, shapes, ARCH)
    return _without_rope(args, _every_step(args.num_layers, NO_ROPE_STEP))


def _every_step(n: int, step: int) -> list[bool]:
    return [(i + 1) % step != 0 for i in range(n)]


def _without_rope(args: ModelArgs, uses_rope: list[bool]) -> ModelArgs:
    types = [kind if rope else NOPE for kind, rope in zip(args.layer_types, uses_rope)]
    return replace(args, layer_types=types, rope={**args.rope, NOPE: RopeArgs(args.rope[GLOBAL].theta, rotary_dim=0)})
