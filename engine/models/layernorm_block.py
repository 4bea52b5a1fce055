"""The block of the LayerNorm families (Cohere, StableLM 2, StarCoder 2): LayerNorms (centred; with a bias but in
Cohere's) in place of RMSNorms, and attention and the MLP either in turn (each after its norm) or side by side on one norm of the input
(`ModelArgs.parallel_residual`: Cohere, StableLM's `use_parallel_residual`), both added to the residual in
transformers' order."""
from __future__ import annotations

import torch
from torch import nn

from engine.models.args import ModelArgs
from engine.models.layers import Attention, CausalLM, LayerNorm, add_and_norm, mlp


class Block(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int, bias: bool):
        super().__init__()
        self.kind = args.layer_types[layer_id]
        self.input_layernorm = LayerNorm(args.hidden_size, args.rms_norm_eps, bias)
        self.self_attn = Attention(args, layer_id)
        self.post_attention_layernorm = None if args.parallel_residual else \
            LayerNorm(args.hidden_size, args.rms_norm_eps, bias)
        self.mlp = mlp(args)

    def forward(self, h: torch.Tensor, rope, cache, x: torch.Tensor | None = None,
                next_norm: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h, next_norm(h)): `x` is this block's input norm of h when the previous block computed it."""
        x = self.input_layernorm(h) if x is None else x
        h, y = add_and_norm(h, self.self_attn(x, rope, cache), self.post_attention_layernorm)
        return add_and_norm(h, self.mlp(x if y is None else y), next_norm)


class Model(CausalLM):
    bias = False  # the norms' bias

    def __init__(self, args: ModelArgs):
        super().__init__(args, [Block(args, i, self.bias) for i in range(args.num_layers)])
        self.model.norm = LayerNorm(args.hidden_size, args.rms_norm_eps, self.bias)
