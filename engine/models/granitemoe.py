"""Granite MoE (IBM Granite 3.x 1B-A400M, 3B-A800M): Granite's block and four scalars, its MLP routed experts; each
token takes the top k by router logit, weighted by a softmax over those k (the full softmax renormalised over them).
Files of Granite 4.0 models with experts but without Mamba layers add an ungated shared expert (ffn_*_shexp)."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.models import granite, llama
from engine.models.args import ModelArgs, gguf_metadata_errors, require

ARCH = "granitemoe"
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model = granite.Model
gguf_fix = granite.gguf_fix
# HF checkpoints stack each layer's experts: input_linear (E, 2I, D) = gate rows then up rows, output_linear (E, D, I)
STACKED = re.compile(r"(model\.layers\.\d+)\.block_sparse_moe\.(input_linear|output_linear|router\.layer)\.weight")


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    where = "config.json (granitemoe)"
    return granite.args_from_hf(
        config, ARCH, num_experts=require(config, "num_local_experts", where),
        experts_per_token=require(config, "num_experts_per_tok", where),
        moe_intermediate_size=require(config, "intermediate_size", where), norm_topk_prob=True)


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    args = granite.args_from_gguf(meta, shapes, ARCH)
    if not args.num_experts:
        raise UnsupportedModelError("This granitemoe file names no experts (granitemoe.expert_count).")
    # Granite MoE Shared (Granite 4.0's experts): its shared expert ungated
    return replace(args, shared_expert_gated=False) if args.shared_expert_size else args


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF's stacked experts and router, as the shared MoE layer's per-expert gate/up/down and its gate."""
    out = {}
    for name, w in llama.sanitize(weights, args).items():
        m = STACKED.fullmatch(name)
        if m is None:
            out[name] = w
            continue
        layer, part = m.groups()
        if part == "router.layer":
            out[f"{layer}.mlp.gate.weight"] = w
            continue
        inter, hidden = args.moe_intermediate_size, args.hidden_size
        rows = 2 * inter if part == "input_linear" else hidden
        cols = hidden if part == "input_linear" else inter
        if tuple(w.shape) != (args.num_experts, rows, cols):
            raise UnsupportedModelError(f"{name} has shape {tuple(w.shape)}, not ({args.num_experts}, {rows}, {cols}) "
                                        "as the config's experts and sizes say.")
        for e in range(args.num_experts):
            base = f"{layer}.mlp.experts.{e}."
            if part == "input_linear":
                out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = w[e].split(inter)
            else:
                out[base + "down_proj.weight"] = w[e]
    return out
