"""Programmatic dependent launch (Hopper and newer): a kernel may start while the one before it finishes.

A decode step is a chain of ~170 small kernels, and each one's launch used to wait for the previous
one to drain. Launched with PDL, a kernel's programs get resident early and block in `wait` (at the top
of every kernel here, before its first load of anything an earlier kernel writes, and before any store)
until the previous kernel has finished and its writes are visible; then each one lets the next kernel
launch. Kernels that are not ours (cuBLAS, torch) are launched normally and keep stream order.

`PARLEY_PDL=0` turns it off (benchmarks compare both ways).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.env_switch import switched_off


@functools.lru_cache(maxsize=8)
def _supported(device_index: int) -> bool:
    has_ops = hasattr(tl.extra, "cuda") and hasattr(tl.extra.cuda, "gdc_wait")
    return has_ops and torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: CUDA, compute capability 9+, not switched off."""
    if device.type != "cuda" or switched_off("PARLEY_PDL"):
        return False
    return _supported(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(t: torch.Tensor) -> dict:
    """Keyword arguments for a kernel launch: the kernel's `PDL` constexpr, and `launch_pdl` only when on
    (a Triton too old for PDL knows no such option)."""
    return {"PDL": True, "launch_pdl": True} if pdl_supported(t.device) else {"PDL": False}


@triton.jit
def wait_for_previous(PDL: tl.constexpr):
    """Blocks until the previous kernel's writes are visible, then lets the next kernel launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _bulk_prefetch(addresses, nbytes):
    # one cp.async.bulk.prefetch.L2 per lane; lanes with nothing to fetch skip it
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addresses, nbytes], dtype=tl.int32, is_pure=False, pack=1,
    )


@triton.jit
def prefetch_l2(ptr, n_elements, LANES: tl.constexpr):
    """Asks L2 for [ptr, ptr + n_elements) before `wait_for_previous`: a GEMM's weights do not depend on
    the previous kernel, so they stream in while it runs. Each lane takes one 16-byte-aligned piece
    (the range must start 16-byte aligned and span a multiple of 16 bytes)."""
    elem: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    align: tl.constexpr = 16 // elem
    piece = tl.cdiv(n_elements, LANES * align) * align
    start = tl.arange(0, LANES) * piece
    count = tl.minimum(piece, tl.maximum(n_elements - start, 0))
    _bulk_prefetch(ptr + start, (count * elem).to(tl.uint32))


@triton.jit
def prefetch_l2_rows(ptr, row_stride, n_rows, row_elements, ROWS: tl.constexpr, LANES: tl.constexpr):
    """`prefetch_l2` of `n_rows` (<= ROWS) rows of `row_elements` each, `row_stride` apart: a split-K
    GEMM's slice of its weight rows. LANES / ROWS lanes per row (same alignment rules per row)."""
    elem: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    align: tl.constexpr = 16 // elem
    per_row: tl.constexpr = LANES // ROWS
    piece = tl.cdiv(row_elements, per_row * align) * align
    lane = tl.arange(0, LANES)
    row, start = lane // per_row, (lane % per_row) * piece
    count = tl.where(row < n_rows, tl.minimum(piece, tl.maximum(row_elements - start, 0)), 0)
    _bulk_prefetch(ptr + row.to(tl.int64) * row_stride + start, (count * elem).to(tl.uint32))
