"""Triton `x @ wᵀ` for decode-sized row counts (M <= 64): the GEMMs of a decode step.

At one to a few dozen rows a decode step's projections read a few MB of weights each and are bound
by launch and memory latency; cuBLAS spends 4-5 us on each on an H200. Here one program owns a
BLOCK_N slice of the output columns for all rows and streams its weight rows once, in BLOCK_K steps.
The row tile is always ROWS = 64 (unused rows masked, they cost no memory traffic), so a row's result
never depends on how many other rows the step has: batched == alone, bit for bit, for these GEMMs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 64  # the one row tile: every M <= 64 runs the same code, so reductions never change order


@triton.jit
def _skinny_linear(
    X, W, Y, M, N, K,
    stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # -- one K step: the rows' slice of x and this program's weight rows
        k_ok = (k0 + offs_k) < K
        x = tl.load(X + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)
        w = tl.load(W + offs_n[:, None] * stride_wn + (k0 + offs_k)[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        if DOT_FP32:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        if IEEE:  # fp32 weights: full fp32 products, not TF32
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def skinny_linear_triton(
    x: torch.Tensor,  # (M, K), M <= 64
    weight: torch.Tensor,  # (N, K)
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:  # (M, N) in x's dtype
    M, K = x.shape
    N, Kw = weight.shape
    assert K == Kw, (x.shape, weight.shape)
    rows = 16 if x.device.type == "cpu" else ROWS  # the interpreter runs a smaller tile (tests only)
    assert M <= rows, f"skinny_linear takes at most {rows} rows here, not {M}"
    assert x.stride(1) == 1 and weight.stride(1) == 1, "the reduction axis must be contiguous"
    assert x.dtype == weight.dtype and x.device == weight.device
    interpret = x.device.type == "cpu"
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    bn = block_n or (16 if interpret or N <= 2048 else 32)  # narrow outputs: more programs in flight
    bk = block_k or (32 if interpret else 128)
    _skinny_linear[(triton.cdiv(N, bn),)](
        x, weight, y, M, N, K,
        x.stride(0), weight.stride(0), y.stride(0),
        BLOCK_M=rows, BLOCK_N=bn, BLOCK_K=bk,
        DOT_FP32=interpret and x.dtype == torch.bfloat16, IEEE=x.dtype == torch.float32,
        num_warps=num_warps or 4, num_stages=num_stages or 3,
    )
    return y
