"""Fused per-token ops for decode steps (see kernels/norms_triton.py), each beside its PyTorch reference.

`impl="triton"` runs the kernels (CUDA, or CPU under TRITON_INTERPRET=1), `impl="reference"` the plain
PyTorch below, which does what engine/models/layers.py does module by module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import IMPLS
from kernels.reference import kv_write_reference


def _check(impl: str) -> bool:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl == "triton"


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).type_as(x) if gemma else weight * xf.to(x.dtype)


def add_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, gemma: bool, *,
    residual: torch.Tensor | None = None, pre_weight: torch.Tensor | None = None, impl: str = "triton",
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(residual + pre_norm(x), norm(that)); without a residual the sum is x (or pre_norm(x)) itself.
    With a residual, `x` may be a split-K GEMM's fp32 partials (S, T, D): their sum is the delta."""
    if _check(impl):
        from kernels.norms_triton import add_norm_triton

        total, y = add_norm_triton(x, weight, eps, gemma, residual, pre_weight)
        if residual is None:
            total = x if pre_weight is None else None  # the kernel writes no sum without a residual
        return total, y
    if x.dim() == 3 and residual is not None and residual.dim() == 2:
        x = sum_partials(x, residual.dtype)
    v = rms_norm_reference(x, pre_weight, eps, gemma) if pre_weight is not None else x
    total = residual + v if residual is not None else v
    return total, (rms_norm_reference(total, weight, eps, gemma) if weight is not None else None)


def embed_norm(
    tokens: torch.Tensor, table: torch.Tensor, scale: float | None, weight: torch.Tensor, eps: float, gemma: bool, *,
    row_scale: torch.Tensor | None = None, dtype: torch.dtype | None = None, int4_pairs: torch.Tensor | None = None,
    impl: str = "triton",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, norm(h)) for h = table[tokens], times `scale` (rounded to h's dtype first, as a tensor of that dtype would
    be) when given: a step's embeddings and the first block's input norm, one launch. A quantized embedding's rows
    are dequantized in fp32 and rounded to `dtype` (the model's): `row_scale` (V,) makes the table int8 codes (code *
    the row's scale); `int4_pairs` makes it int4 words with these (scale, zero) pairs (kernels/quant_linear.py)."""
    dtype = dtype or table.dtype
    if scale is not None:
        scale = float(torch.tensor(scale, dtype=dtype))
    if _check(impl):
        from kernels.norms_triton import embed_norm_triton

        return embed_norm_triton(tokens, table, scale, weight, eps, gemma, row_scale, dtype, int4_pairs)
    if int4_pairs is not None:
        from kernels.quant_linear import int4_gather_rows, int4_rows_reference

        rows = int4_gather_rows(table, int4_pairs, tokens)
        h = int4_rows_reference(*rows, torch.float32, weight.shape[0]).to(dtype)
    elif row_scale is not None:
        h = (table[tokens].float() * row_scale[tokens].float()[:, None]).to(dtype)
    else:
        h = F.embedding(tokens, table)
    if scale is not None:
        h = h * torch.tensor(scale, dtype=h.dtype, device=h.device)
    return h, rms_norm_reference(h, weight, eps, gemma)


def sum_partials(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A split-K GEMM's (S, T, N) fp32 partials -> (T, N) in `dtype`, summed in split order."""
    total = partials[0]
    for part in partials[1:]:
        total = total + part
    return total.to(dtype)


def norm_rope(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, gemma: bool, cos: torch.Tensor, sin: torch.Tensor, *,
    impl: str = "triton",
) -> torch.Tensor:
    """Per-head RMSNorm (when `weight` is given) then the half-split rotary embedding; x (T, H, D)."""
    if _check(impl):
        from kernels.norms_triton import norm_rope_triton

        return norm_rope_triton(x, weight, eps, gemma, cos, sin)
    if weight is not None:
        x = rms_norm_reference(x, weight, eps, gemma)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def act_mul(x: torch.Tensor, act: str, *, dtype: torch.dtype | None = None, impl: str = "triton") -> torch.Tensor:
    """x (..., 2I) = [gate | up] -> act(gate) * up; act 'gelu_tanh' or 'silu'. With `dtype` (the model's), `x` is a
    split-K GEMM's fp32 partials (S, T, 2I), summed first."""
    if _check(impl):
        from kernels.norms_triton import act_mul_triton

        return act_mul_triton(x, act, dtype)
    if dtype is not None:
        x = sum_partials(x, dtype)
    gate, up = x.chunk(2, dim=-1)
    a = F.gelu(gate, approximate="tanh") if act == "gelu_tanh" else F.silu(gate)
    return a * up


def qkv_rope_write(
    qkv: torch.Tensor, heads: int, kv_heads: int, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
    eps: float, gemma: bool, positions: torch.Tensor, inv_freq: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, *, dtype: torch.dtype | None = None,
    impl: str = "triton",
) -> torch.Tensor:
    """A fused QKV row's attention prologue in one launch: q and k normed per head and rotated at
    `positions` by `inv_freq` (the rotary tables made in the kernel), k and v written into the caches at
    `slots`; returns q (T, H, D). Norm weights both given or both None. `qkv` may be a split-K GEMM's fp32
    partials (S, T, W), summed first; `dtype` is then the model's (default: qkv's)."""
    if _check(impl):
        from kernels.norms_triton import qkv_rope_write_triton

        return qkv_rope_write_triton(qkv, heads, kv_heads, q_weight, k_weight, eps, gemma, positions, inv_freq,
                                     k_cache, v_cache, slots, dtype)
    if qkv.dim() == 3:
        qkv = sum_partials(qkv, dtype or qkv.dtype)
    cos, sin = rope_tables(positions, inv_freq, qkv.dtype)
    t, d = qkv.shape[0], k_cache.shape[-1]
    q, k, v = qkv.view(t, heads + 2 * kv_heads, d).split([heads, kv_heads, kv_heads], dim=1)
    q = norm_rope(q, q_weight, eps, gemma, cos, sin, impl="reference")
    k = norm_rope(k, k_weight, eps, gemma, cos, sin, impl="reference")
    kv_write_reference(k_cache, v_cache, k, v, slots)
    return q


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, 1, D) of the half-split rotary embedding, in `dtype`."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)
