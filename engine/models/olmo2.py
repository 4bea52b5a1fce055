"""OLMo 2: the Llama block with its norms moved: each sublayer's output is normed before its residual add (no input
norms), and the q/k norms span the whole projection rather than each head. llama.cpp writes OLMo 3 (engine/models/
olmo3.py) as this architecture with a sliding window: its sliding layers rotate without the file's YaRN scaling."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from engine.models import llama
from engine.models.args import (
    GGUF_BLOCK_NAMES, GLOBAL, SLIDING, ModelArgs, RopeArgs, gguf_layer_kinds, gguf_metadata_errors, positive,
)
from engine.models.layers import Attention, CausalLM, GatedMLP, RMSNorm, add_and_norm

ARCH = "olmo2"
SLIDING_PERIOD = 4  # OLMo 3: every fourth layer attends to the whole context (llama.cpp's and transformers' default)
GGUF_BLOCK_NAMES = {**GGUF_BLOCK_NAMES, "post_attention_norm": "post_attention_layernorm",
                    "post_ffw_norm": "post_feedforward_layernorm"}
sanitize = llama.sanitize


class Block(nn.Module):
    input_layernorm = None  # nothing norms a block's input: the previous block hands it no norm

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.kind = args.layer_types[layer_id]
        self.self_attn = Attention(args, layer_id)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act)
        self.post_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, h: torch.Tensor, rope, cache, x: torch.Tensor | None = None,
                next_norm: RMSNorm | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h, next_norm(h)): next_norm is the final norm after the last block, else None."""
        h, _ = add_and_norm(h, self.self_attn(h, rope, cache), None, pre=self.post_attention_layernorm)
        return add_and_norm(h, self.mlp(h), next_norm, pre=self.post_feedforward_layernorm)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args, [Block(args, i) for i in range(args.num_layers)])


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    return llama.args_from_hf(config, ARCH, qk_norm=True, qk_norm_whole=True)


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    args = llama.args_from_gguf(meta, shapes, ARCH, qk_norm=True, qk_norm_whole=True)
    window = meta.get(f"{ARCH}.attention.sliding_window") or 0
    if not window:
        return args
    kinds = gguf_layer_kinds(meta.get(f"{ARCH}.attention.sliding_window_pattern", SLIDING_PERIOD), args.num_layers,
                             f"{ARCH}.attention.sliding_window_pattern")
    sliding = RopeArgs(float(meta.get(f"{ARCH}.rope.freq_base_swa") or args.rope[GLOBAL].theta))
    # the file's YaRN gain moves from the whole model to the full layers' rotary, which keeps it
    return replace(args, layer_types=kinds, sliding_window=positive(window, f"{ARCH}.attention.sliding_window"),
                   rope={GLOBAL: args.rope[GLOBAL], SLIDING: sliding}, attn_factor=1.0)


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    return tensor  # NEOX rope: llama.cpp keeps OLMo 2's Q/K rows (and their whole-projection norms) as HF has them
