"""Cohere (Command-R, Command-R 08-2024, Aya 23, Aya Expanse): one LayerNorm (mean-centred, no bias) feeds attention
and the MLP side by side, both added to the residual; interleaved rotary (q/k rows reordered to the half-split layout
at load, as Llama's GGUF rows are); logits multiplied by a scale; tied embeddings."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.errors import UnsupportedModelError
from engine.models import llama
from engine.models.args import ModelArgs, gguf_metadata_errors
from engine.models.layers import Attention, CausalLM, GatedMLP, LayerNorm, add_and_norm

ARCH = "cohere"
GGUF_ARCH = "command-r"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
gguf_fix = llama.gguf_fix  # the interleaved q/k rows to the half-split layout, as for Llama's permuted GGUF rows


class Block(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.kind = args.layer_types[layer_id]
        self.input_layernorm = LayerNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, layer_id)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act)

    def forward(self, h: torch.Tensor, rope, cache, x: torch.Tensor | None = None,
                next_norm: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h + attn(x) + mlp(x), next_norm of that), x the input norm of h; added in transformers' order."""
        x = self.input_layernorm(h) if x is None else x
        h, _ = add_and_norm(h, self.self_attn(x, rope, cache), None)
        return add_and_norm(h, self.mlp(x), next_norm)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args, [Block(args, i) for i in range(args.num_layers)])
        self.model.norm = LayerNorm(args.hidden_size, args.rms_norm_eps)


def _logit_scale(scale: Any) -> float:
    scale = float(scale)
    if not scale > 0:  # also NaN
        raise UnsupportedModelError(f"Cohere's logit scale must be a positive number, not {scale}.")
    return 1.0 / scale


def args_from_hf(config: dict[str, Any], model_type: str = ARCH) -> ModelArgs:
    if config.get("use_qk_norm"):
        raise UnsupportedModelError("Command-R+ (per-head q/k LayerNorms) is not supported; Command-R and Aya are.")
    return llama.args_from_hf(config, model_type, rms_norm_eps=float(config.get("layer_norm_eps", 1e-5)),
                              logits_scaling=_logit_scale(config.get("logit_scale", 0.0625)),
                              tie_word_embeddings=bool(config.get("tie_word_embeddings", True)))


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]], arch: str = GGUF_ARCH) -> ModelArgs:
    """`arch`: the file's architecture key, also the model type of Cohere 2's files."""
    if "blk.0.attn_q_norm.weight" in shapes:
        raise UnsupportedModelError("Command-R+ (per-head q/k LayerNorms) is not supported; Command-R and Aya are.")
    return llama.args_from_gguf(
        meta, shapes, arch, model_type=ARCH if arch == GGUF_ARCH else arch,
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
