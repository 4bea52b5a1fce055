"""EXAONE 3.0 / 3.5 (LG AI Research): Llama's block under other tensor names in HF folders (`transformer.h.N.…`,
written by the model's own code) and other config keys. GGUF files keep the Q/K rows as HF has them (NEOX rotary)."""
from __future__ import annotations

from typing import Any

import torch

from engine.models import llama
from engine.models.args import ModelArgs, gguf_metadata_errors

ARCH = "exaone"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = llama.Model
# HF name parts -> this module's, in this order (out_proj before the rest of attn.attention)
HF_NAMES = (("transformer.wte.", "model.embed_tokens."), ("transformer.ln_f.", "model.norm."),
            ("transformer.h.", "model.layers."), (".ln_1.", ".input_layernorm."),
            (".ln_2.", ".post_attention_layernorm."), (".attn.attention.out_proj.", ".self_attn.o_proj."),
            (".attn.attention.", ".self_attn."), (".mlp.c_fc_0.", ".mlp.gate_proj."),
            (".mlp.c_fc_1.", ".mlp.up_proj."), (".mlp.c_proj.", ".mlp.down_proj."))


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    return llama.args_from_hf({
        **config, "num_hidden_layers": config.get("num_layers", config.get("num_hidden_layers")),
        "rms_norm_eps": config.get("layer_norm_epsilon", 1e-5),
        "hidden_act": config.get("activation_function", "silu"),
    }, ARCH)


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    return llama.args_from_gguf(meta, shapes, ARCH)


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in weights.items():
        for hf, ours in HF_NAMES:
            name = name.replace(hf, ours)
        out[name] = tensor
    return llama.sanitize(out, args)


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    return tensor  # NEOX rope: llama.cpp keeps EXAONE's Q/K rows as HF has them
