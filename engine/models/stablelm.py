"""StableLM 2 (1.6B, Zephyr; StableLM-3B-4E1T): Llama's block with LayerNorms (weight and bias), q/k/v biases and a
quarter of each head rotated (engine/models/partial_rotary.py). A model whose blocks run attention and the MLP side by
side on one norm (`use_parallel_residual`; in GGUF, no ffn_norm) runs them as Cohere's block does; the 12B's per-head
q/k norms are refused."""
from __future__ import annotations

from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.models import layernorm_block, llama, partial_rotary
from engine.models.args import ModelArgs, gguf_metadata_errors, hf_rope_params
from engine.models.partial_rotary import rotary_rows

ARCH = "stablelm"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
gguf_fix = partial_rotary.gguf_fix  # NEOX rope: only the partial rotary moves the q/k rows


class Model(layernorm_block.Model):
    bias = True


def _refuse_qk_norms() -> None:
    raise UnsupportedModelError("StableLM 2 12B (per-head q/k LayerNorms) is not supported; the 1.6B and 3B are.")


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    if config.get("qk_layernorm"):
        _refuse_qk_norms()
    fraction = hf_rope_params(config).get("partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0
    args = llama.args_from_hf(config, ARCH, rms_norm_eps=float(config.get("layer_norm_eps", 1e-5)),
                              attention_bias=bool(config.get("use_qkv_bias", False)),
                              parallel_residual=bool(config.get("use_parallel_residual", False)))
    return partial_rotary.partial(args, float(fraction), "StableLM")


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    if "blk.0.attn_q_norm.weight" in shapes:
        _refuse_qk_norms()
    args = llama.args_from_gguf(meta, shapes, ARCH,
                                rms_norm_eps=float(meta.get(f"{ARCH}.attention.layer_norm_epsilon", 1e-5)),
                                parallel_residual="blk.0.ffn_norm.weight" not in shapes)
    rot = meta.get(f"{ARCH}.rope.dimension_count", args.head_dim)
    return partial_rotary.partial(args, float(rot) / args.head_dim, "StableLM")


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF names match; the q/k rows (and biases) in the partial rotary's order."""
    out = llama.sanitize(weights, args)
    for name, tensor in out.items():
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            out[name] = rotary_rows(tensor, args.num_heads, args)
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            out[name] = rotary_rows(tensor, args.num_kv_heads, args)
    return out
