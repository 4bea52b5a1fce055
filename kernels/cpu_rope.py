"""The attention prologue of a CPU step in one library call (kernels/cpu/rope.c): q/k head norms, rotary embedding,
and K/V written straight into the cache. Plain PyTorch reference beside it (`impl="reference"`)."""
from __future__ import annotations

import torch

from kernels import cpu_native
from kernels.cpu_attend import CACHE_DTYPES

MAX_HEAD_DIM = 1024  # the kernel's one-head scratch


def qk_rope_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor | None,
                  k_weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                  slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                  impl: str = "auto") -> torch.Tensor:
    """q (T, H·D), k and v (T, Hkv·D) fp32 (views of one fused product, or three) -> q (T, H, D): q and k heads
    RMS-normed (weights None: not) and rotated by the (T, D) cos/sin tables (HF's half-split layout); k and v rows
    written to the caches ((rows, Hkv, D), or any shape whose leading axes flatten to rows; fp32, or both fp16: each
    value rounded to nearest as `.to(torch.float16)` rounds it) at `slots` (T,) int64."""
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        return qk_rope_write_reference(q, k, v, q_weight, k_weight, eps, cos, sin, slots, k_cache, v_cache)
    t, d, n_kv = q.shape[0], k_cache.shape[-1], k_cache.shape[-2]
    if not all(x.dtype == torch.float32 for x in (q, k, v, cos, sin)) \
            or k_cache.dtype not in CACHE_DTYPES or v_cache.dtype != k_cache.dtype:
        raise ValueError("qk_rope_write takes fp32 tensors, and fp32 or fp16 caches")
    if d > MAX_HEAD_DIM or any(x.stride(-1) != 1 for x in (q, k, v)) or k.stride(0) != v.stride(0) \
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("qk_rope_write takes unit-stride heads, k and v rows of one stride, contiguous caches and "
                         "heads of at most 1024")
    cos, sin = cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous()
    weights = [None if w is None else w.float().contiguous() for w in (q_weight, k_weight)]  # held past the call
    slots = slots.long().contiguous()
    out = torch.empty(t, q.shape[1] // d, d, dtype=torch.float32)
    call = kernel.lib.parley_qk_rope_write if k_cache.dtype == torch.float32 else kernel.lib.parley_qk_rope_write_f16
    call(q.data_ptr(), k.data_ptr(), v.data_ptr(), t, q.stride(0), k.stride(0), out.shape[1], n_kv, d,
         *(None if w is None else w.data_ptr() for w in weights), eps, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
         k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr())
    return out


def qk_rope_write_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor | None,
                            k_weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                            slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    t, d, n_kv = q.shape[0], k_cache.shape[-1], k_cache.shape[-2]
    cos, sin = cos.reshape(t, 1, d).float(), sin.reshape(t, 1, d).float()

    def prepare(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        x = x.float().reshape(t, -1, d)
        if weight is not None:
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        rotated = torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)
        return x * cos + rotated * sin

    k_cache.view(-1, n_kv, d).index_copy_(0, slots, prepare(k, k_weight).to(k_cache.dtype))
    v_cache.view(-1, n_kv, d).index_copy_(0, slots, v.reshape(t, n_kv, d).to(v_cache.dtype))
    return prepare(q, q_weight)
