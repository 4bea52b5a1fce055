"""Gemma 3 (text): sandwich norms, GELU-tanh MLP, q/k norms, 5 sliding-window layers per global layer."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.models.args import (
    GGUF_BLOCK_NAMES,
    GLOBAL,
    SLIDING,
    ModelArgs,
    RopeArgs,
    gguf_layer_count,
    gguf_metadata_errors,
    hf_layer_types,
    positive,
    require,
    rope_from_hf,
)
from engine.models.layers import Attention, CausalLM, GatedMLP, RMSNorm, add_and_norm

ARCH = "gemma3"
SLIDING_PATTERN = 6  # not stored in GGUF: every 6th layer is global
LOCAL_ROPE_THETA = 10000.0  # not stored in GGUF

GGUF_BLOCK_NAMES = {
    **GGUF_BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


class Block(nn.Module):
    gemma_norm = True  # norms scale by (1 + w); GLM-4's sandwich (engine/models/glm4.py) by w

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.kind = args.layer_types[layer_id]
        dim, eps, gemma = args.hidden_size, args.rms_norm_eps, self.gemma_norm
        self.input_layernorm = RMSNorm(dim, eps, gemma=gemma)
        self.self_attn = Attention(args, layer_id, gemma_norm=gemma)
        self.post_attention_layernorm = RMSNorm(dim, eps, gemma=gemma)
        self.pre_feedforward_layernorm = RMSNorm(dim, eps, gemma=gemma)
        self.mlp = GatedMLP(dim, args.intermediate_size, args.hidden_act)
        self.post_feedforward_layernorm = RMSNorm(dim, eps, gemma=gemma)

    def forward(self, h: torch.Tensor, rope, cache, x: torch.Tensor | None = None,
                next_norm: RMSNorm | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h, next_norm(h)): `x` is this block's input norm of h when the previous block computed it."""
        attn = self.self_attn(self.input_layernorm(h) if x is None else x, rope, cache)
        h, x = add_and_norm(h, attn, self.pre_feedforward_layernorm, pre=self.post_attention_layernorm)
        return add_and_norm(h, self.mlp(x), next_norm, pre=self.post_feedforward_layernorm)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args, [Block(args, i) for i in range(args.num_layers)], gemma_norm=True)
        self.embed_scale = args.hidden_size**0.5


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    config = config.get("text_config", config)
    where = "config.json (gemma3)"
    hidden = require(config, "hidden_size", where)
    heads = require(config, "num_attention_heads", where)
    head_dim = config.get("head_dim") or hidden // heads
    n_layers = require(config, "num_hidden_layers", where)
    return ModelArgs(
        model_type=ARCH,
        vocab_size=require(config, "vocab_size", where),
        hidden_size=hidden,
        intermediate_size=require(config, "intermediate_size", where),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope=_hf_ropes(config, head_dim),
        layer_types=hf_layer_types(config, n_layers, SLIDING_PATTERN),
        sliding_window=int(config.get("sliding_window") or 4096),
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        attention_bias=bool(config.get("attention_bias", False)),
        qk_norm=True,
        query_pre_attn_scalar=float(config.get("query_pre_attn_scalar") or head_dim),
        hidden_act=config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh",
        final_logit_softcapping=config.get("final_logit_softcapping"),
    )


def _hf_ropes(config: dict[str, Any], head_dim: int) -> dict[str, RopeArgs]:
    params = config.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers v5 layout
        return {
            GLOBAL: rope_from_hf(params["full_attention"], head_dim),
            SLIDING: rope_from_hf(params.get("sliding_attention", {"rope_theta": LOCAL_ROPE_THETA}), head_dim),
        }
    global_params = dict(config.get("rope_scaling") or {})
    global_params["rope_theta"] = config.get("rope_theta", 1_000_000.0)
    local = {"rope_theta": config.get("rope_local_base_freq", LOCAL_ROPE_THETA)}
    return {GLOBAL: rope_from_hf(global_params, head_dim), SLIDING: rope_from_hf(local, head_dim)}


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    def get(key: str, default: Any = None) -> Any:
        full = f"{ARCH}.{key}"
        return require(meta, full, "The GGUF metadata") if default is None else meta.get(full, default)

    hidden = positive(get("embedding_length"), f"{ARCH}.embedding_length")
    heads = positive(get("attention.head_count"), f"{ARCH}.attention.head_count")
    head_dim = positive(get("attention.key_length", hidden // heads), f"{ARCH}.attention.key_length")
    n_layers = gguf_layer_count(get("block_count"), shapes, f"{ARCH}.block_count")
    global_rope = RopeArgs(float(get("rope.freq_base", 1_000_000.0)))
    if meta.get(f"{ARCH}.rope.scaling.type") == "linear":
        global_rope.factors = [float(meta[f"{ARCH}.rope.scaling.factor"])] * (head_dim // 2)
    # llama.cpp scales Gemma 3 27B's queries by hidden/heads and every other size by head_dim.
    scalar = hidden / heads if n_layers == 62 else head_dim
    return ModelArgs(
        model_type=ARCH,
        vocab_size=int(shapes["token_embd.weight"][0]),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope={GLOBAL: global_rope, SLIDING: RopeArgs(LOCAL_ROPE_THETA)},
        layer_types=[GLOBAL if (i + 1) % SLIDING_PATTERN == 0 else SLIDING for i in range(n_layers)],
        sliding_window=int(get("attention.sliding_window", 4096)),
        max_position_embeddings=int(get("context_length", 32768)),
        tie_word_embeddings="output.weight" not in shapes,
        qk_norm=True,
        query_pre_attn_scalar=float(scalar),
        hidden_act="gelu_pytorch_tanh",
        name=str(meta.get("general.name", "")),
    )


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF Gemma stores norm weights as w for a (1 + w) scale; this model stores the folded (1 + w)."""
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("language_model.")
        if not name.startswith(("model.", "lm_head.")) or "rotary_emb" in name:
            continue  # vision tower and projector of the multimodal checkpoints
        out[name] = w.float() + 1.0 if _is_norm(name) else w
    if args.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    return tensor  # llama.cpp already folded Gemma's +1 into the norms; rope is NEOX
