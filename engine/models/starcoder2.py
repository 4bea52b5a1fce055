"""StarCoder 2 (3B, 7B, 15B, and its instruct tunes): LayerNorms with biases, biases on every projection, an MLP
without a gate (down(gelu(up(x)))), tied embeddings. Its HF config's sliding window (4,096 keys) covers every layer,
as transformers applies it; llama.cpp's converter does not store it, so a GGUF file attends to every key, as llama.cpp
does (they differ past 4,096 tokens only)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.models import layernorm_block, llama
from engine.models.args import GLOBAL, SLIDING, ModelArgs, gguf_metadata_errors, positive

ARCH = "starcoder2"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
HF_NAMES = {".mlp.c_fc.": ".mlp.up_proj.", ".mlp.c_proj.": ".mlp.down_proj."}


class Model(layernorm_block.Model):
    bias = True


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    bias = bool(config.get("use_bias", True))
    args = llama.args_from_hf({**config, "use_sliding_window": False}, ARCH,
                              rms_norm_eps=float(config.get("norm_epsilon", 1e-5)), attention_bias=bias,
                              dense_bias=bias, gated_mlp=False,
                              hidden_act=config.get("hidden_act", "gelu_pytorch_tanh"),
                              tie_word_embeddings=bool(config.get("tie_word_embeddings", True)))
    return _with_window(args, config.get("sliding_window"))


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    args = llama.args_from_gguf(meta, shapes, ARCH,
                                rms_norm_eps=float(meta.get(f"{ARCH}.attention.layer_norm_epsilon", 1e-5)),
                                dense_bias="blk.0.attn_output.bias" in shapes, gated_mlp=False,
                                hidden_act="gelu_pytorch_tanh")
    return _with_window(args, meta.get(f"{ARCH}.attention.sliding_window"))


def _with_window(args: ModelArgs, window: Any) -> ModelArgs:
    if not window:
        return args
    return replace(args, sliding_window=positive(window, "sliding window"), layer_types=[SLIDING] * args.num_layers,
                   rope={**args.rope, SLIDING: args.rope[GLOBAL]})


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF names -> this module's (the MLP's c_fc / c_proj are its up / down projections)."""
    out = {}
    for name, tensor in llama.sanitize(weights, args).items():
        for hf, ours in HF_NAMES.items():
            name = name.replace(hf, ours)
        out[name] = tensor
    return out


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    return tensor  # NEOX rope: llama.cpp keeps the Q/K rows as HF has them
