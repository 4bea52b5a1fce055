"""Phi-3 / Phi-3.5 / Phi-4 / Phi-4-mini: the Llama block with q/k/v and gate/up fused in the file, an optional sliding
window on every layer, and LongRoPE on the 128k variants. The fused matrices are split into Llama's at load (their
rows, quantized or not), so every backend runs the Llama block unchanged. LongRoPE keeps both factor sets; the loader
picks one by the sessions' context (args.fit_context): the short within the original context (4k on Phi-3.5), the
long beyond it, for every position, as llama.cpp does. Phi-4-mini rotates 3/4 of each head: its q/k rows are
reordered at load so that the rotated dims pair as a whole head's do and the rest rotate by frequency 0."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.models import llama, partial_rotary
from engine.models.args import GLOBAL, SLIDING, ModelArgs, RopeArgs, hf_rope_params, rope_from_hf
from engine.models.partial_rotary import rotary_dim, rotary_rows

ARCH = "phi3"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model
gguf_fix = partial_rotary.gguf_fix  # NEOX rope: only a partial rotary moves the q/k rows
LONG_ROPE_TENSORS = ("rope_factors_short.weight", "rope_factors_long.weight")


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    params = hf_rope_params(config)
    rot = rotary_dim(float(params.get("partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0),
                     head_dim, "Phi")
    partial = rot if rot < head_dim else None
    kind = params.get("rope_type") or params.get("type") or "default"
    overrides: dict[str, Any] = {}
    if kind in ("longrope", "su"):
        original = int(params.get("original_max_position_embeddings") or config["original_max_position_embeddings"])
        factor = config["max_position_embeddings"] / original
        attention = params.get("attention_factor") or _long_rope_attention(factor, original)
        theta = float(params.get("rope_theta", 10000.0))
        short, long = ([float(f) for f in params[key]] for key in ("short_factor", "long_factor"))
        if not len(short) == len(long) == rot // 2:
            raise UnsupportedModelError(f"LongRoPE lists {len(short)} and {len(long)} factors for {rot // 2} "
                                        "rotary frequencies.")
        overrides = dict(attn_factor=float(attention), rope={GLOBAL: RopeArgs(theta, short, partial)},
                         long_rope=RopeArgs(theta, long, partial), original_context=original)
    elif partial:
        overrides["rope"] = {GLOBAL: replace(rope_from_hf(params, rot), rotary_dim=partial)}
    args = llama.args_from_hf(config, ARCH, **overrides)
    return _with_window(args, config.get("sliding_window"))


def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    args = llama.args_from_gguf(meta, shapes, ARCH)
    rot = meta.get(f"{ARCH}.rope.dimension_count", args.head_dim)
    if not isinstance(rot, int) or not 0 < rot <= args.head_dim:
        raise UnsupportedModelError(f"The GGUF rotates {rot!r} dims of each {args.head_dim}-dim attention head.")
    rot = rotary_dim(rot / args.head_dim, args.head_dim, "Phi")
    partial = rot if rot < args.head_dim else None
    args.rope[GLOBAL].rotary_dim = partial
    if LONG_ROPE_TENSORS[0] in shapes or LONG_ROPE_TENSORS[1] in shapes:
        if not all(name in shapes for name in LONG_ROPE_TENSORS):
            raise ModelLoadError("The GGUF has one of LongRoPE's factor tensors but not both "
                                 f"({', '.join(LONG_ROPE_TENSORS)}).")
        original = meta.get(f"{ARCH}.rope.scaling.original_context_length")
        if not isinstance(original, int) or original <= 0:
            raise ModelLoadError("The GGUF has LongRoPE factors but no phi3.rope.scaling.original_context_length.")
        attention = meta.get(f"{ARCH}.rope.scaling.attn_factor")
        if attention is None:
            attention = _long_rope_attention(args.max_position_embeddings / original, original)
        args.attn_factor, args.original_context = float(attention), original
        args.long_rope = RopeArgs(args.rope[GLOBAL].theta, [], partial)  # both factor sets: read from the tensors
    return _with_window(args, meta.get(f"{ARCH}.attention.sliding_window"))


def gguf_rope_factors(name: str, args: ModelArgs) -> RopeArgs | None:
    """The rope a factor tensor fills: LongRoPE's short factors are the model's rope, the long ones `long_rope`."""
    if args.long_rope is None or name not in LONG_ROPE_TENSORS:
        return None
    return args.rope[GLOBAL] if name == LONG_ROPE_TENSORS[0] else args.long_rope


def gguf_split(name: str, shape: tuple[int, ...], args: ModelArgs) -> list[tuple[str, int, int]] | None:
    """The row ranges of a fused tensor under Llama's names: attn_qkv (q, k, v) and a fused ffn_up (gate, up)."""
    prefix, _, part = name.rpartition(".attn_qkv.")
    if prefix:
        q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        _check_rows(name, shape, q + 2 * kv)
        return [(f"{prefix}.attn_{p}.{part}", a, b) for p, a, b in (("q", 0, q), ("k", q, q + kv),
                                                                      ("v", q + kv, q + 2 * kv))]
    prefix, _, part = name.rpartition(".ffn_up.")
    if prefix and shape[0] == 2 * args.intermediate_size:
        inter = args.intermediate_size
        return [(f"{prefix}.ffn_gate.{part}", 0, inter), (f"{prefix}.ffn_up.{part}", inter, 2 * inter)]
    return None


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF's fused qkv_proj and gate_up_proj, split into Llama's q/k/v and gate/up."""
    out = {}
    q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    for name, w in llama.sanitize(weights, args).items():
        if name.endswith("self_attn.qkv_proj.weight"):
            _check_rows(name, tuple(w.shape), q + 2 * kv)
            base = name.removesuffix("qkv_proj.weight")
            wq, wk, out[base + "v_proj.weight"] = w.split([q, kv, kv])
            out[base + "q_proj.weight"] = rotary_rows(wq, args.num_heads, args)
            out[base + "k_proj.weight"] = rotary_rows(wk, args.num_kv_heads, args)
        elif name.endswith("mlp.gate_up_proj.weight"):
            _check_rows(name, tuple(w.shape), 2 * args.intermediate_size)
            base = name.removesuffix("gate_up_proj.weight")
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = w.chunk(2)
        else:
            out[name] = w
    return out


def _with_window(args: ModelArgs, window: Any) -> ModelArgs:
    # Phi-3-mini/medium-4k: every layer attends to the last `sliding_window` keys, as in transformers (llama.cpp 0.3
    # attends to every key of a phi3 file: tests/engine/test_phi3.py)
    if not window:
        return args
    # one RopeArgs for both kinds: factors the loader reads later reach both
    return replace(args, sliding_window=int(window), layer_types=[SLIDING] * args.num_layers,
                   rope={**args.rope, SLIDING: args.rope[GLOBAL]})


def _long_rope_attention(factor: float, original: int) -> float:
    # LongRoPE's scale of q·k (HF applies it to cos and sin); 1 when the context is not extended
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _check_rows(name: str, shape: tuple[int, ...], rows: int) -> None:
    if shape[0] != rows:
        raise ModelLoadError(f"{name} has {shape[0]} rows where the model's head counts need {rows}")
