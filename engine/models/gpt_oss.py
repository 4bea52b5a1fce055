"""gpt-oss (OpenAI gpt-oss-20b, gpt-oss-120b): Llama's blocks with biases on every attention projection, a learned sink
logit per head in each attention softmax, sliding-window layers (128 keys) alternating with full ones, YaRN, and a
mixture of experts: a router with a bias, softmax over the top 4, experts with biases and a clamped gated activation
(engine/models/layers.ClampedGLU). Folders hold the experts' gate and up interleaved (and often as MXFP4 blocks:
dequantized here); llama.cpp's files hold them apart, their MXFP4 experts kept 4-bit on the CPU's own kernels
(engine/quant/block_codes.py) and re-quantized to int8 groups elsewhere (a notice says so).
A GGUF's YaRN frequencies are llama.cpp's (its ramp is truncated; transformers' config says not to): each runs as
its own reference does."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.models import llama, qwen2
from engine.quant.block_codes import FP4_CODES
from engine.models.args import GLOBAL, SLIDING, ModelArgs, gguf_metadata_errors, hf_layer_types, positive, require

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


def sanitize(weights: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """transformers' names and stacked experts -> one module per expert (gate and up de-interleaved, MXFP4 blocks
    dequantized)."""
    out: dict[str, torch.Tensor] = {}
    for name in list(weights):
        if name.endswith("_scales"):
            continue
        tensor = weights.pop(name)
        if name.endswith("_blocks"):
            stem = name.removesuffix("_blocks")
            scales = weights.pop(f"{stem}_scales", None)
            if scales is None:
                raise ModelLoadError(f"{name} has no {stem}_scales beside it.")
            tensor, name = dequantize_mxfp4(tensor, scales).transpose(1, 2), stem
        if ".mlp.experts." in name:
            out.update(_experts(name, tensor, args))
        else:
            out[name.replace(".mlp.router.", ".mlp.gate.")] = tensor
    return llama.sanitize(out, args)


def _experts(name: str, stacked: torch.Tensor, args: ModelArgs) -> dict[str, torch.Tensor]:
    """One stacked experts tensor -> each expert's gate/up/down weight or bias (HF holds weights as (in, out))."""
    prefix, _, kind = name.rpartition(".mlp.experts.")
    if stacked.shape[0] != args.num_experts:
        raise ModelLoadError(f"{name} holds {stacked.shape[0]} experts, the model has {args.num_experts}.")
    bias = kind.endswith("_bias")
    proj = kind.removesuffix("_bias")
    out = {}
    for e in range(args.num_experts):
        t = stacked[e] if bias else stacked[e].t()
        at = f"{prefix}.mlp.experts.{e}"
        suffix = "bias" if bias else "weight"
        if proj == "gate_up_proj":  # rows interleaved: gate, up, gate, up, ...
            out[f"{at}.gate_proj.{suffix}"], out[f"{at}.up_proj.{suffix}"] = t[0::2].contiguous(), t[1::2].contiguous()
        elif proj == "down_proj":
            out[f"{at}.down_proj.{suffix}"] = t.contiguous()
        else:
            raise ModelLoadError(f"Unexpected experts tensor {name}.")
    return out


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 (…, groups, 16) bytes — two 4-bit floats each, low nibble first — and (…, groups) power-of-two scales
    (biased by 127) -> fp32 (…, groups · 32)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape \
            or blocks.shape[-1] != 16:
        raise ModelLoadError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match.")
    lut = (torch.from_numpy(FP4_CODES).float() - 12) / 2  # the 16 e2m1 values (FP4_CODES are them doubled, + 12)
    values = torch.stack((lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]), dim=-1).flatten(-2)
    values = torch.ldexp(values, (scales.to(torch.int32) - 127)[..., None])
    return values.flatten(-2)
