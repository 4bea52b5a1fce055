"""Llama (Llama 2/3.x, SmolLM2): pre-norm blocks, SiLU gated MLP, GQA, optional llama3 rope scaling."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.models.args import (
    GGUF_BLOCK_NAMES,
    GLOBAL,
    ModelArgs,
    RopeArgs,
    hf_layer_types,
    gguf_layer_count,
    gguf_metadata_errors,
    hf_rope_params,
    positive,
    require,
    rope_from_hf,
    yarn_factors,
    yarn_mscale,
)
from engine.models.layers import Attention, CausalLM, RMSNorm, add_and_norm
from engine.models.moe import feed_forward

ARCH = "llama"

GGUF_BLOCK_NAMES = {**GGUF_BLOCK_NAMES, "ffn_norm": "post_attention_layernorm"}


class Block(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.kind = args.layer_types[layer_id]
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, layer_id)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = feed_forward(args, layer_id)  # a dense gated MLP, or routed experts (Mixtral, Qwen3-MoE)

    def forward(self, h: torch.Tensor, rope, cache, x: torch.Tensor | None = None,
                next_norm: RMSNorm | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h, next_norm(h)): `x` is this block's input norm of h when the previous block computed it."""
        attn = self.self_attn(self.input_layernorm(h) if x is None else x, rope, cache)
        h, x = add_and_norm(h, attn, self.post_attention_layernorm)
        return add_and_norm(h, self.mlp(x), next_norm)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args, [Block(args, i) for i in range(args.num_layers)])


def args_from_hf(config: dict[str, Any], model_type: str = ARCH, **overrides: Any) -> ModelArgs:
    where = f"config.json ({model_type})"
    hidden = require(config, "hidden_size", where)
    heads = require(config, "num_attention_heads", where)
    head_dim = config.get("head_dim") or hidden // heads
    n_layers = require(config, "num_hidden_layers", where)
    kw: dict[str, Any] = dict(
        model_type=model_type,
        vocab_size=require(config, "vocab_size", where),
        hidden_size=hidden,
        intermediate_size=require(config, "intermediate_size", where),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope=overrides.get("rope") or {GLOBAL: rope_from_hf(hf_rope_params(config), head_dim,
                                                            config.get("max_position_embeddings"))},
        layer_types=[GLOBAL] * n_layers,
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", False)),
        hidden_act=config.get("hidden_act", "silu"),
    )
    kw.update(overrides)
    if "layer_types" not in overrides and config.get("use_sliding_window") and config.get("sliding_window"):
        types = hf_layer_types(config, n_layers)
        if "sliding" in types:
            kw.update(layer_types=types, sliding_window=int(config["sliding_window"]))
            kw["rope"] = {**kw["rope"], "sliding": kw["rope"][GLOBAL]}
    return ModelArgs(**kw)


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]], arch: str = ARCH, **overrides: Any) -> ModelArgs:
    def get(key: str, default: Any = None) -> Any:
        full = f"{arch}.{key}"
        if default is None:
            return require(meta, full, "The GGUF metadata")
        return meta.get(full, default)

    hidden = positive(get("embedding_length"), f"{arch}.embedding_length")
    heads = positive(get("attention.head_count"), f"{arch}.attention.head_count")
    head_dim = positive(get("attention.key_length", hidden // heads), f"{arch}.attention.key_length")
    n_layers = gguf_layer_count(get("block_count"), shapes, f"{arch}.block_count")
    kv = get("attention.head_count_kv", heads)
    rope = RopeArgs(float(get("rope.freq_base", 10000.0)))
    if "rope_freqs.weight" in shapes:
        rope.factors = []  # filled from the rope_freqs tensor by the loader
    elif (scaling := meta.get(f"{arch}.rope.scaling.type")) == "linear":
        rope.factors = [float(meta[f"{arch}.rope.scaling.factor"])] * (head_dim // 2)
    elif scaling == "yarn":
        rope = _yarn_from_gguf(meta, arch, rope.theta, int(get("rope.dimension_count", head_dim)),
                               int(get("context_length", 4096)))
    elif scaling not in (None, "none", "longrope"):  # LongRoPE: phi3.py, by its tensors
        raise UnsupportedModelError(f"Rotary scaling type {scaling!r} is not supported.")
    kw: dict[str, Any] = dict(
        model_type=arch,
        vocab_size=int(shapes["token_embd.weight"][0]),
        hidden_size=hidden,
        intermediate_size=int(meta.get(f"{arch}.feed_forward_length") or get("expert_feed_forward_length")),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=int(kv[0] if isinstance(kv, list) else kv),
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope={GLOBAL: rope},
        layer_types=[GLOBAL] * n_layers,
        max_position_embeddings=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in shapes,
        attention_bias="blk.0.attn_q.bias" in shapes,
        qk_norm="blk.0.attn_q_norm.weight" in shapes,
        name=str(meta.get("general.name", "")),
    )
    kw.update(gguf_experts(meta, shapes, arch))
    kw.update(overrides)
    return ModelArgs(**kw)


def _yarn_from_gguf(meta: dict[str, Any], arch: str, theta: float, dims: int, context: int) -> RopeArgs:
    """llama.cpp's YaRN keys (its converters write the factor and the original context; the betas default as in
    transformers), read as rope_from_hf reads a config's. A config's explicit attention_factor comes as
    yarn_attn_factor (or attn_factor from older OLMo 3 conversions): the whole gain, as transformers applies it."""
    factor = float(require(meta, f"{arch}.rope.scaling.factor", "The GGUF metadata"))
    original = int(meta.get(f"{arch}.rope.scaling.original_context_length") or context)
    factors = yarn_factors(theta, dims, factor, original, float(meta.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
                           float(meta.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)))
    gain = meta.get(f"{arch}.rope.scaling.yarn_attn_factor") or meta.get(f"{arch}.rope.scaling.attn_factor")
    return RopeArgs(theta, factors, attn_factor=float(gain or yarn_mscale(factor)))


def gguf_experts(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]], arch: str) -> dict[str, Any]:
    """A mixture of experts' ModelArgs fields from GGUF metadata (Mixtral's files say "llama"), or none when dense.
    llama.cpp renormalises the chosen experts' weights for these models whatever their config said."""
    experts = meta.get(f"{arch}.expert_count") or 0
    if not experts:
        return {}
    if "blk.0.ffn_gate.0.weight" in shapes:
        raise UnsupportedModelError("This mixture-of-experts file stores each expert as a tensor of its own (an "
                                    "older llama.cpp conversion); convert the model again with a current llama.cpp.")
    if not any(name.endswith(".ffn_gate_exps.weight") for name in shapes):  # layer 0 may be dense (ERNIE 4.5)
        raise ModelLoadError(f"The metadata says the model is a mixture of {experts} experts, but the file holds no "
                             "expert tensors (blk.0.ffn_gate_exps.weight).")
    used = require(meta, f"{arch}.expert_used_count", "The GGUF metadata")
    inter = meta.get(f"{arch}.expert_feed_forward_length") or require(meta, f"{arch}.feed_forward_length",
                                                                        "The GGUF metadata")
    # a shared expert every token takes: its width from its tensors (the first layers may be dense)
    shared = next((shape[0] for name, shape in shapes.items() if name.endswith(".ffn_gate_shexp.weight")), 0)
    return dict(num_experts=positive(experts, f"{arch}.expert_count", 4096), experts_per_token=int(used),
                moe_intermediate_size=positive(inter, f"{arch}.expert_feed_forward_length"), norm_topk_prob=True,
                shared_expert_size=int(shared))


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF checkpoint names -> this module's names (they match; drop what the model does not own)."""
    out = {k: v for k, v in weights.items() if "rotary_emb" not in k}
    if args.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    """llama.cpp permutes Q/K rows for its interleaved rope; undo it to get HF's half-split layout."""
    if name.endswith(("attn_q.weight", "attn_q.bias")):
        return unpermute(tensor, args.num_heads)
    if name.endswith(("attn_k.weight", "attn_k.bias")):
        return unpermute(tensor, args.num_kv_heads)
    return tensor


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).transpose(1, 2).reshape(shape)
