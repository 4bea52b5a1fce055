"""RMSNorm and a block's residual add + norms on the CPU, one library call each (kernels/cpu/norms.c), for models
that run on Parley's CPU kernels (weights in the blocks format). Plain PyTorch is the reference: engine/models/layers.py.
"""
from __future__ import annotations

import torch

from kernels.cpu_native import cpu_kernel


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 and t.is_contiguous() else t.float().contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(x · rsqrt(mean(x²) + eps)) · weight over the last axis, fp32 (weight: the (+1-folded) fp32 scale)."""
    x, w = _f32(x), _f32(weight)  # held here: a converted copy must outlive the call
    out = torch.empty_like(x)
    d = x.shape[-1]
    cpu_kernel().lib.parley_rms_norm(x.data_ptr(), x.numel() // d, d, w.data_ptr(), eps, out.data_ptr())
    return out


def add_norm(h: torch.Tensor, delta: torch.Tensor, pre: torch.Tensor | None, norm: torch.Tensor | None,
             eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(h + pre_norm(delta), norm(that sum)): a block's residual step; either norm may be absent."""
    h, delta = _f32(h), _f32(delta)
    pre, norm = (None if t is None else _f32(t) for t in (pre, norm))  # held here: copies must outlive the call
    d = h.shape[-1]
    h_out = torch.empty_like(h)
    x_out = torch.empty_like(h) if norm is not None else None
    scratch = torch.empty(d)
    cpu_kernel().lib.parley_add_norm(h.data_ptr(), delta.data_ptr(), h.numel() // d, d,
                                     pre.data_ptr() if pre is not None else None,
                                     norm.data_ptr() if norm is not None else None, eps, h_out.data_ptr(),
                                     x_out.data_ptr() if x_out is not None else None, scratch.data_ptr())
    return h_out, x_out
