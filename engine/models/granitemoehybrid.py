"""Granite 4.0 without Mamba layers (`granitemoehybrid` folders, llama.cpp's `granitehybrid` files: Granite-4.0-Micro,
-1B, -350M): Granite's block and four scalars, its MLP the "shared" one (a fused gate|up `input_linear`, an
`output_linear`), or routed experts beside it as an ungated shared expert; rotary positions only where the config asks
(`position_embedding_type`), else none. Granite 4.0-H's Mamba-2 layers are refused in one line."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.models import granite, granitemoe, llama
from engine.models.args import GLOBAL, NOPE, ModelArgs, RopeArgs, gguf_metadata_errors, require

ARCH = "granitehybrid"  # llama.cpp's name; transformers' is granitemoehybrid
GGUF_BLOCK_NAMES = llama.GGUF_BLOCK_NAMES
Model, gguf_fix = granite.Model, granite.gguf_fix
ATTENTION = ("attention", "full_attention")
MAMBA = "Granite 4.0-H's Mamba-2 layers are not supported; the Granite 4.0 models without them (Micro, 1B, 350M) are."


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    where = "config.json (granitemoehybrid)"
    kinds = config.get("layer_types") or config.get("layers_block_type") or ["linear_attention"]
    if any(kind not in ATTENTION for kind in kinds):
        raise UnsupportedModelError(MAMBA)
    shared = int(require(config, "shared_intermediate_size", where))
    experts = int(config.get("num_local_experts") or 0)
    mlp: dict[str, Any] = dict(intermediate_size=shared)
    if experts:
        mlp = dict(num_experts=experts, experts_per_token=require(config, "num_experts_per_tok", where),
                   moe_intermediate_size=require(config, "intermediate_size", where), norm_topk_prob=True,
                   shared_expert_size=shared, shared_expert_gated=False)
    args = granite.args_from_hf(config, "granitemoehybrid", **mlp)
    return args if config.get("position_embedding_type") == "rope" else _without_rope(args)


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    kv = meta.get(f"{ARCH}.attention.head_count_kv")
    if isinstance(kv, list) and not all(kv):  # a layer without KV heads is a Mamba-2 layer
        raise UnsupportedModelError(MAMBA)
    args = replace(granite.args_from_gguf(meta, shapes, ARCH), shared_expert_gated=False)
    # llama.cpp rotates only where the converter marked the rotary as trained in (rope.scaling.finetuned)
    return args if meta.get(f"{ARCH}.rope.scaling.finetuned") else _without_rope(args)


def _without_rope(args: ModelArgs) -> ModelArgs:
    return replace(args, layer_types=[NOPE] * args.num_layers,
                   rope={NOPE: RopeArgs(args.rope[GLOBAL].theta, rotary_dim=0)})


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """The shared MLP's fused gate|up and down under the dense MLP's names (or the shared expert's), and the stacked
    experts as Granite MoE's."""
    out = {}
    target = "mlp.shared_expert" if args.num_experts else "mlp"
    inter = args.shared_expert_size if args.num_experts else args.intermediate_size
    for name, w in (granitemoe.sanitize(weights, args) if args.num_experts else llama.sanitize(weights, args)).items():
        layer, _, rest = name.partition(".shared_mlp.")
        if rest == "input_linear.weight":
            if w.shape[0] != 2 * inter:
                raise UnsupportedModelError(f"{name} has {w.shape[0]} rows, not the config's 2 × {inter}.")
            out[f"{layer}.{target}.gate_proj.weight"], out[f"{layer}.{target}.up_proj.weight"] = w.split(inter)
        elif rest == "output_linear.weight":
            out[f"{layer}.{target}.down_proj.weight"] = w
        else:
            out[name] = w
    return out
