"""OLMo 3 folders: OLMo 2's block with sliding-window attention on three layers of four, and YaRN rotary scaling (the
long-context checkpoints) on the full-attention layers only; the sliding ones rotate plainly. llama.cpp's files of
these models say "olmo2" with a sliding window (engine/models/olmo2.py reads them)."""
from __future__ import annotations

from typing import Any

from engine.models import llama, olmo2
from engine.models.args import GLOBAL, SLIDING, ModelArgs, RopeArgs, hf_layer_types, hf_rope_params, rope_from_hf

ARCH = "olmo3"
DEFAULT_THETA = 500000.0  # transformers' Olmo3Config default
GGUF_BLOCK_NAMES = olmo2.GGUF_BLOCK_NAMES
Block, Model, sanitize, gguf_fix, args_from_gguf = olmo2.Block, olmo2.Model, olmo2.sanitize, olmo2.gguf_fix, \
    olmo2.args_from_gguf


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    n = int(llama.require(config, "num_hidden_layers", f"config.json ({ARCH})"))
    kinds = hf_layer_types(config, n, olmo2.SLIDING_PERIOD)
    heads = int(llama.require(config, "num_attention_heads", f"config.json ({ARCH})"))
    head_dim = config.get("head_dim") or int(llama.require(config, "hidden_size", f"config.json ({ARCH})")) // heads
    window = config.get("sliding_window") if SLIDING in kinds else None
    return llama.args_from_hf(config, ARCH, qk_norm=True, qk_norm_whole=True, layer_types=kinds,
                              sliding_window=window, rope=_hf_ropes(config, head_dim))


def _hf_ropes(config: dict[str, Any], head_dim: int) -> dict[str, RopeArgs]:
    """Per layer kind: transformers v5 keeps a dict per layer type; a v4 config's rope_scaling is the full layers'."""
    config = {"rope_theta": DEFAULT_THETA, **config}
    params = config.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = {"rope_theta": config["rope_theta"], **(params.get("full_attention") or {})}
        sliding = {"rope_theta": config["rope_theta"], **(params.get("sliding_attention") or {})}
    else:
        full = hf_rope_params(config)
        sliding = {"rope_theta": full["rope_theta"]}
    limit = config.get("max_position_embeddings")
    return {GLOBAL: rope_from_hf(full, head_dim, limit), SLIDING: rope_from_hf(sliding, head_dim, limit)}
