"""Triton write of a step's K and V into the batched-sequence store at flat slots.

`slot = row * C + column` indexes the `[rows * C]` view of `[rows, C, Hkv, D]` storage
(the cache computes it). One program writes one token's K and V (Hkv * D values each).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, wait_for_previous


@triton.jit
def _kv_write(
    K, V, KCache, VCache, Slots,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cs, stride_ch, stride_vcs, stride_vch,
    HKV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous(PDL)
    t = tl.program_id(0)
    # -- this token's slot in the flat [rows * C] view
    slot = tl.load(Slots + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    h = offs // HEAD_DIM
    d = offs % HEAD_DIM
    valid = offs < HKV * HEAD_DIM
    # -- copy K and V, casting to the storage dtype
    k = tl.load(K + t * stride_kt + h * stride_kh + d, mask=valid)
    v = tl.load(V + t * stride_vt + h * stride_vh + d, mask=valid)
    tl.store(KCache + slot * stride_cs + h * stride_ch + d, k.to(KCache.dtype.element_ty), mask=valid)
    tl.store(VCache + slot * stride_vcs + h * stride_vch + d, v.to(VCache.dtype.element_ty), mask=valid)


def kv_write_triton(
    k_cache: torch.Tensor,  # (rows, C, Hkv, D)
    v_cache: torch.Tensor,  # (rows, C, Hkv, D)
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    slots: torch.Tensor,  # (T,) int64
) -> None:
    rows, C, Hkv, D = k_cache.shape
    T = k.shape[0]
    assert v_cache.shape == k_cache.shape, (k_cache.shape, v_cache.shape)
    assert k.shape == v.shape == (T, Hkv, D), (k.shape, v.shape, k_cache.shape)
    assert slots.shape == (T,) and slots.dtype == torch.int64, (slots.shape, slots.dtype)
    for cache in (k_cache, v_cache):
        # The flat slot view needs row stride == C * column stride and a contiguous head dim.
        assert cache.stride(0) == C * cache.stride(1) and cache.stride(3) == 1, cache.stride()
    assert k.stride(2) == 1 and v.stride(2) == 1, "head dim must be contiguous"
    assert k.device == v.device == k_cache.device == v_cache.device == slots.device
    if T == 0:
        return
    block = triton.next_power_of_2(Hkv * D)
    _kv_write[(T,)](
        k, v, k_cache, v_cache, slots,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
        HKV=Hkv, HEAD_DIM=D, BLOCK=block,
        num_warps=4 if block <= 2048 else 8, **launch_options(k),
    )
