"""gpt-oss (OpenAI gpt-oss-20b, gpt-oss-120b): Llama's blocks with biases on every attention projection, a learned sink
logit per head in each attention softmax, sliding-window layers (128 keys) alternating with full ones, YaRN, and a
mixture of experts: a router with a bias, softmax over the top 4, experts with biases and a clamped gated activation
(engine/models/layers.ClampedGLU). Folders hold the experts' gate and up interleaved (and often as MXFP4 blocks);
llama.cpp's files hold them apart. MXFP4 experts, from either, stay 4-bit on the CPU's own kernels and on CUDA
(engine/quant/mxfp4.py, engine/quant/from_gguf.py `mxfp4_matrix`), and are re-quantized to int8 rows on torch's CPU
kernels (a notice says so).
A GGUF's YaRN frequencies are llama.cpp's (its ramp is truncated; transformers' config says not to): each runs as
its own reference does."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.models import llama, qwen2
from engine.models.args import GLOBAL, SLIDING, ModelArgs, gguf_metadata_errors, hf_layer_types, positive, require
from engine.quant.mxfp4 import Mxfp4Rows, stacked_mxfp4

ARCH = "gpt-oss"  # llama.cpp's name; transformers' is gpt_oss
GGUF_BLOCK_NAMES = {**llama.GGUF_BLOCK_NAMES, "post_attention_norm": "post_attention_layernorm"}
GGUF_BLOCK_PARAMS = {"attn_sinks": "self_attn.sinks"}  # blk.N.attn_sinks.weight: the parameter itself
Model = llama.Model
gguf_fix = qwen2.gguf_fix  # NEOX rope: the files keep transformers' q/k row order
LIMIT, ALPHA = 7.0, 1.702  # the reference's clamp and sigmoid slope (llama.cpp's files do not store them)


def args_from_hf(config: dict[str, Any]) -> ModelArgs:
    where = "config.json (gpt_oss)"
    n = int(require(config, "num_hidden_layers", where))
    types = hf_layer_types(config, n) if config.get("layer_types") else \
        [SLIDING if i % 2 == 0 else GLOBAL for i in range(n)]  # transformers' default: sliding first
    args = llama.args_from_hf(
        {"attention_bias": True, **config}, "gpt_oss", num_experts=require(config, "num_local_experts", where),
        experts_per_token=require(config, "num_experts_per_tok", where),
        moe_intermediate_size=require(config, "intermediate_size", where), norm_topk_prob=True, dense_bias=True,
        router_bias=True, expert_bias=True, attn_sinks=True, glu_limit=float(config.get("swiglu_limit", LIMIT)),
        glu_alpha=float(config.get("swiglu_alpha", ALPHA)), rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)))
    return _windowed(args, types, config.get("sliding_window"))


@gguf_metadata_errors
def args_from_gguf(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> ModelArgs:
    if "blk.0.ffn_gate_up_exps.weight" in shapes:
        raise UnsupportedModelError("This gpt-oss file fuses its experts' gate and up (ffn_gate_up_exps); convert it "
                                    "again without fusing them.")
    if not meta.get(f"{ARCH}.expert_count"):
        raise UnsupportedModelError(f"The GGUF metadata does not define {ARCH}.expert_count.")
    base = llama.args_from_gguf(meta, shapes, ARCH, dense_bias="blk.0.attn_output.bias" in shapes,
                                router_bias="blk.0.ffn_gate_inp.bias" in shapes,
                                expert_bias="blk.0.ffn_gate_exps.bias" in shapes,
                                attn_sinks="blk.0.attn_sinks.weight" in shapes, glu_limit=LIMIT, glu_alpha=ALPHA)
    types = [SLIDING if i % 2 == 0 else GLOBAL for i in range(base.num_layers)]  # llama.cpp's pattern for gpt-oss
    return _windowed(base, types, meta.get(f"{ARCH}.attention.sliding_window"))


def _windowed(args: ModelArgs, types: list[str], window: Any) -> ModelArgs:
    if SLIDING not in types:
        return replace(args, layer_types=types)
    window = positive(window, "gpt-oss's sliding window") if window is not None else None
    if window is None:
        raise UnsupportedModelError("gpt-oss has sliding-window layers but its settings give no window size.")
    return replace(args, layer_types=types, sliding_window=int(window), rope={**args.rope, SLIDING: args.rope[GLOBAL]})


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor | Mxfp4Rows]:
    """transformers' names and stacked experts -> one module per expert (gate and up de-interleaved); MXFP4 blocks
    stay blocks (`Mxfp4Rows`, per expert matrix: the loader holds them 4-bit or decodes them)."""
    out: dict[str, torch.Tensor | Mxfp4Rows] = {}
    for name in list(weights):
        if name.endswith("_scales"):
            continue
        tensor = weights.pop(name)
        if name.endswith("_blocks"):
            stem = name.removesuffix("_blocks")
            scales = weights.pop(f"{stem}_scales", None)
            if scales is None:
                raise ModelLoadError(f"{name} has no {stem}_scales beside it.")
            tensor, name = stacked_mxfp4(tensor, scales, name), stem
        if ".mlp.experts." in name:
            out.update(_experts(name, tensor, args))
        else:
            out[name.replace(".mlp.router.", ".mlp.gate.")] = tensor
    return llama.sanitize(out, args)


def _experts(name: str, stacked: torch.Tensor | list[Mxfp4Rows],
             args: ModelArgs) -> dict[str, torch.Tensor | Mxfp4Rows]:
    """One stacked experts tensor (or MXFP4 matrices, one per expert, already (out, in)) -> each expert's gate/up/down
    weight or bias (HF holds float weights as (in, out))."""
    prefix, _, kind = name.rpartition(".mlp.experts.")
    if len(stacked) != args.num_experts:
        raise ModelLoadError(f"{name} holds {len(stacked)} experts, the model has {args.num_experts}.")
    bias = kind.endswith("_bias")
    proj = kind.removesuffix("_bias")
    out = {}
    for e in range(args.num_experts):
        t = stacked[e] if bias or isinstance(stacked, list) else stacked[e].t()
        at = f"{prefix}.mlp.experts.{e}"
        suffix = "bias" if bias else "weight"
        if proj == "gate_up_proj":  # rows interleaved: gate, up, gate, up, ...
            out[f"{at}.gate_proj.{suffix}"], out[f"{at}.up_proj.{suffix}"] = _rows(t, 0), _rows(t, 1)
        elif proj == "down_proj":
            out[f"{at}.down_proj.{suffix}"] = t if isinstance(t, Mxfp4Rows) else t.contiguous()
        else:
            raise ModelLoadError(f"Unexpected experts tensor {name}.")
    return out


def _rows(t: torch.Tensor | Mxfp4Rows, first: int) -> torch.Tensor | Mxfp4Rows:
    """Every other row of `t` from `first` (gate: 0, up: 1)."""
    return t.rows(slice(first, None, 2)) if isinstance(t, Mxfp4Rows) else t[first::2].contiguous()
