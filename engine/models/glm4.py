"""GLM-4 (GLM-4-9B/32B-0414, GLM-Z1): Gemma 3's sandwich of four norms (plain RMSNorm) around attention with q/k/v
biases and a fused gate/up MLP, and a rotary over the first half of each head's dims in adjacent pairs (GPT-J's
order, in folders and files alike). The loader reorders q/k rows into the half-split order, then into the partial
rotary's (engine/models/partial_rotary.py): q·k does not depend on the order, only on q and k sharing it."""
from __future__ import annotations

from typing import Any

import torch

from engine.models import gemma3, llama, phi3
from engine.models.args import GLOBAL, ModelArgs, gguf_metadata_errors
from engine.models.layers import CausalLM
from engine.models.partial_rotary import hf_partial_rope, partial, partial_rotary_order, reorder_qk

ARCH = "glm4"
GGUF_BLOCK_NAMES = gemma3.GGUF_BLOCK_NAMES  # post_attention_norm, ffn_norm (before the MLP), post_ffw_norm
gguf_split = phi3.gguf_split  # a fused ffn_up (gate rows, then up), an attn_qkv
# HF's norm names -> Gemma 3's block's (exact suffixes; HF's post_attention_layernorm is the norm before the MLP)
HF_NORMS = {"post_self_attn_layernorm": "post_attention_layernorm", "post_attention_layernorm":
            "pre_feedforward_layernorm", "post_mlp_layernorm": "post_feedforward_layernorm"}


class Block(gemma3.Block):
    gemma_norm = False


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args, [Block(args, i) for i in range(args.num_layers)])


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    heads = llama.require(config, "num_attention_heads", f"config.json ({ARCH})")
    head_dim = config.get("head_dim") or llama.require(config, "hidden_size", f"config.json ({ARCH})") // heads
    return llama.args_from_hf(config, ARCH, attention_bias=bool(config.get("attention_bias", True)),
                              rope={GLOBAL: hf_partial_rope(config, head_dim, "GLM-4", 0.5)})


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    args = llama.args_from_gguf(meta, shapes, ARCH)
    return partial(args, float(meta.get(f"{ARCH}.rope.dimension_count", args.head_dim // 2)) / args.head_dim, "GLM-4")


def head_order(args: ModelArgs) -> torch.Tensor:
    """Where each dim of a head comes from: the rotated dims' adjacent pairs (2i, 2i + 1) split into halves, then the
    partial rotary's order."""
    rot = args.rope[GLOBAL].rotary_dim or args.head_dim
    halves = torch.cat([torch.arange(0, rot, 2), torch.arange(1, rot, 2), torch.arange(rot, args.head_dim)])
    return halves[partial_rotary_order(args.head_dim, rot)] if rot < args.head_dim else halves


def _rows(w: torch.Tensor, heads: int, args: ModelArgs) -> torch.Tensor:
    return w.reshape(heads, args.head_dim, *w.shape[1:])[:, head_order(args)].reshape(w.shape)


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    out = {}
    for name, w in phi3.sanitize(weights, args).items():  # its gate_up_proj split (no qkv_proj here)
        prefix, _, last = name.rpartition(".")
        stem, _, norm = prefix.rpartition(".")
        if norm in HF_NORMS:
            name = f"{stem}.{HF_NORMS[norm]}.{last}"
        elif prefix.endswith("self_attn.q_proj"):
            w = _rows(w, args.num_heads, args)
        elif prefix.endswith("self_attn.k_proj"):
            w = _rows(w, args.num_kv_heads, args)
        out[name] = w
    return out


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    return reorder_qk(name, tensor, args, _rows)
