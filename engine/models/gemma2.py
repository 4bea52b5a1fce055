"""Gemma 2: Gemma 3's block without q/k norms, every attention score and the logits capped by tanh, and sliding-window
layers alternating with global ones (one rotary base for both)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.models import gemma3, llama
from engine.models.args import GLOBAL, SLIDING, ModelArgs, gguf_metadata_errors, hf_layer_types, require, rope_from_hf

ARCH = "gemma2"
SLIDING_PATTERN = 2  # layers 0, 2, 4 … slide; llama.cpp and transformers both alternate
ATTN_SOFTCAP, FINAL_SOFTCAP = 50.0, 30.0  # llama.cpp's values where a file leaves them out
GGUF_BLOCK_NAMES = gemma3.GGUF_BLOCK_NAMES
Model = gemma3.Model
sanitize = gemma3.sanitize
gguf_fix = gemma3.gguf_fix


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    where = "config.json (gemma2)"
    head_dim = config.get("head_dim") or require(config, "hidden_size", where) // require(config, "num_attention_heads",
                                                                                        where)
    rope_params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    rope = rope_from_hf(rope_params, head_dim)
    n_layers = require(config, "num_hidden_layers", where)
    return llama.args_from_hf(
        config, ARCH, head_dim=head_dim, rope={GLOBAL: rope, SLIDING: rope},
        layer_types=hf_layer_types(config, n_layers, SLIDING_PATTERN),
        sliding_window=int(config.get("sliding_window") or 4096),
        max_position_embeddings=int(config.get("max_position_embeddings", 8192)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        query_pre_attn_scalar=float(config.get("query_pre_attn_scalar") or head_dim),
        hidden_act=config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh",
        final_logit_softcapping=config.get("final_logit_softcapping"),
        attn_softcap=config.get("attn_logit_softcapping"),
    )


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    def get(key: str, default: Any) -> Any:
        return meta.get(f"{ARCH}.{key}", default)

    base = llama.args_from_gguf(meta, shapes, ARCH)
    # llama.cpp scales Gemma 2 27B's (46 layers) queries by hidden/heads and the 2B's and 9B's by head_dim.
    scalar = base.hidden_size / base.num_heads if base.num_layers == 46 else base.head_dim
    rope = base.rope[GLOBAL]
    return replace(
        base, rope={GLOBAL: rope, SLIDING: rope},
        layer_types=[SLIDING if i % SLIDING_PATTERN == 0 else GLOBAL for i in range(base.num_layers)],
        sliding_window=int(get("attention.sliding_window", 4096)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        query_pre_attn_scalar=float(scalar), hidden_act="gelu_pytorch_tanh",
        final_logit_softcapping=float(get("final_logit_softcapping", FINAL_SOFTCAP)),
        attn_softcap=float(get("attn_logit_softcapping", ATTN_SOFTCAP)),
    )
