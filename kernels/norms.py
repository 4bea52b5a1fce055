"""Fused per-token ops for decode steps (see kernels/norms_triton.py), each beside its PyTorch reference.

`impl="triton"` runs the kernels (CUDA, or CPU under TRITON_INTERPRET=1), `impl="reference"` the plain
PyTorch below, which does what engine/models/layers.py does module by module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import IMPLS


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
    """(residual + pre_norm(x), norm(that)); without a residual the sum is x (or pre_norm(x)) itself."""
    if _check(impl):
        from kernels.norms_triton import add_norm_triton

        total, y = add_norm_triton(x, weight, eps, gemma, residual, pre_weight)
        if residual is None:
            total = x if pre_weight is None else None  # the kernel writes no sum without a residual
        return total, y
    v = rms_norm_reference(x, pre_weight, eps, gemma) if pre_weight is not None else x
    total = residual + v if residual is not None else v
    return total, (rms_norm_reference(total, weight, eps, gemma) if weight is not None else None)


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


def act_mul(x: torch.Tensor, act: str, *, impl: str = "triton") -> torch.Tensor:
    """x (..., 2I) = [gate | up] -> act(gate) * up; act 'gelu_tanh' or 'silu'."""
    if _check(impl):
        from kernels.norms_triton import act_mul_triton

        return act_mul_triton(x, act)
    gate, up = x.chunk(2, dim=-1)
    a = F.gelu(gate, approximate="tanh") if act == "gelu_tanh" else F.silu(gate)
    return a * up
