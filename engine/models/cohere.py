"""Cohere (Command-R, Command-R 08-2024, Aya 23, Aya Expanse): one LayerNorm (mean-centred, no bias) feeds attention
and the MLP side by side, both added to the residual; interleaved rotary (q/k rows reordered to the half-split layout
at load, as Llama's GGUF rows are); logits multiplied by a scale; tied embeddings."""
from __future__ import annotations

from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.models import layernorm_block, llama
from engine.models.args import ModelArgs, gguf_metadata_errors

ARCH = "cohere"
GGUF_ARCH = "command-r"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
gguf_fix = llama.gguf_fix  # the interleaved q/k rows to the half-split layout, as for Llama's permuted GGUF rows
Model = layernorm_block.Model  # side by side (`parallel_residual`), norms without bias


def _logit_scale(scale: Any) -> float:
    scale = float(scale)
    if not scale > 0:  # also NaN
        raise UnsupportedModelError(f"Cohere's logit scale must be a positive number, not {scale}.")
    return 1.0 / scale


def args_from_hf(config: dict[str, Any], model_type: str = ARCH) -> ModelArgs:
    if config.get("use_qk_norm"):
        raise UnsupportedModelError("Command-R+ (per-head q/k LayerNorms) is not supported; Command-R and Aya are.")
    return llama.args_from_hf(config, model_type, rms_norm_eps=float(config.get("layer_norm_eps", 1e-5)),
                              parallel_residual=True,
                              logits_scaling=_logit_scale(config.get("logit_scale", 0.0625)),
                              tie_word_embeddings=bool(config.get("tie_word_embeddings", True)))


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]], arch: str = GGUF_ARCH) -> ModelArgs:
    """`arch`: the file's architecture key, also the model type of Cohere 2's files."""
    if "blk.0.attn_q_norm.weight" in shapes:
        raise UnsupportedModelError("Command-R+ (per-head q/k LayerNorms) is not supported; Command-R and Aya are.")
    return llama.args_from_gguf(
        meta, shapes, arch, model_type=ARCH if arch == GGUF_ARCH else arch, parallel_residual=True,
        rms_norm_eps=float(meta.get(f"{arch}.attention.layer_norm_epsilon", 1e-5)),
        logits_scaling=_logit_scale(meta.get(f"{arch}.logit_scale", 1.0)))


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF names match; the q/k rows (interleaved rotary pairs) are reordered to the half-split layout."""
    out = llama.sanitize(weights, args)
    for name, tensor in out.items():
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            out[name] = llama.unpermute(tensor, args.num_heads)
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            out[name] = llama.unpermute(tensor, args.num_kv_heads)
    return out
