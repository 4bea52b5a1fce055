"""Heads that rotate only their first dims (Phi-4-mini: 3/4, StableLM 2: 1/4), served by the whole-head rotary: the
q/k rows are reordered at load so that the rotated dims pair as a whole head's do, and the rest turn by frequency 0
(layers.inv_freq), so no rotary kernel changes."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from engine.errors import UnsupportedModelError
from engine.models.args import GLOBAL, ModelArgs, RopeArgs, hf_rope_params, rope_from_hf


def rotary_dim(fraction: float, head_dim: int, model: str) -> int:
    """How many dims of each head rotate: an even count from 2 to the head's."""
    rot = int(head_dim * fraction)
    if not 0 < fraction <= 1 or rot < 2 or rot % 2:
        raise UnsupportedModelError(f"This {model} model rotates {fraction:.0%} of each {head_dim}-dim attention head "
                                    f"({rot} dims); a rotary embedding needs an even number of them.")
    return rot


def partial(args: ModelArgs, fraction: float, model: str) -> ModelArgs:
    """`args` with the first `fraction` of each head rotating (a whole head: as before), as a file's
    rope.dimension_count / head_dim gives it."""
    rot = rotary_dim(fraction, args.head_dim, model)
    return replace(args, rope={GLOBAL: replace(args.rope[GLOBAL], rotary_dim=rot if rot < args.head_dim else None)})


def hf_partial_rope(config: dict[str, Any], head_dim: int, model: str, default: float = 1.0) -> RopeArgs:
    """A folder's rotary over its `partial_rotary_factor` of each head (scaling factors for those dims' pairs)."""
    params = hf_rope_params(config)
    rot = rotary_dim(float(params.get("partial_rotary_factor") or config.get("partial_rotary_factor") or default),
                     head_dim, model)
    return replace(rope_from_hf(params, rot, config.get("max_position_embeddings")),
                   rotary_dim=rot if rot < head_dim else None)


def partial_rotary_order(head_dim: int, rot: int) -> torch.Tensor:
    """A head's dims in the order a whole-head rotary pairs right: HF rotates dims (i, i + rot/2) for i < rot/2 and
    passes the rest; [rotated first half, passed first half, rotated second half, passed second half] pairs
    (i, i + head_dim/2) instead, the rotated dims as HF does, the passed with each other (frequency 0 leaves them).
    q and k move alike, so every q·k is unchanged."""
    half, rest = rot // 2, (head_dim - rot) // 2
    return torch.cat([torch.arange(0, half), torch.arange(rot, rot + rest), torch.arange(half, rot),
                      torch.arange(rot + rest, head_dim)])


def rotary_rows(w: torch.Tensor, heads: int, args: ModelArgs) -> torch.Tensor:
    """q or k rows (or biases) of `heads` heads in `partial_rotary_order`; as they are when the whole head rotates."""
    rot = args.rope[GLOBAL].rotary_dim
    if not rot:
        return w
    order = partial_rotary_order(args.head_dim, rot)
    return w.reshape(heads, args.head_dim, *w.shape[1:])[:, order].reshape(w.shape)


def gguf_fix(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    """A NEOX-rope file's q/k rows (llama.cpp keeps them as HF has them) in the partial rotary's order."""
    return reorder_qk(name, tensor, args, rotary_rows)


def reorder_qk(name: str, tensor: torch.Tensor, args: ModelArgs,
               rows: Callable[[torch.Tensor, int, ModelArgs], torch.Tensor]) -> torch.Tensor:
    """A file's q or k rows (and biases) through `rows(tensor, heads, args)`; any other tensor as it is."""
    if name.endswith(("attn_q.weight", "attn_q.bias")):
        return rows(tensor, args.num_heads, args)
    if name.endswith(("attn_k.weight", "attn_k.bias")):
        return rows(tensor, args.num_kv_heads, args)
    return tensor
