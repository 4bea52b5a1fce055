"""Triton `x @ wᵀ` for decode-sized row counts (M <= 64): the GEMMs of a decode step.

At one to a few dozen rows a decode step's projections read a few MB of weights each and are bound
by launch and memory latency; cuBLAS spends 4-6 us on each on an H200. Here one program owns a
BLOCK_N slice of the output columns for all rows and streams its weight rows once, in BLOCK_K steps.
The row tile is always ROWS = 64 (unused rows masked, they cost no memory traffic), so a row's result
never depends on how many other rows the step has: batched == alone, bit for bit, for these GEMMs.
Launched with PDL (kernels/pdl.py), a program asks L2 for its weight rows before waiting for the
previous kernel, so they stream in while that kernel runs (H200, in a chain of 18: 2.6-4.9 us vs
cuBLAS 3.9-6.4). With `act` the weight is a fused [gate | up] and the epilogue writes act(gate) * up.

With `splits` > 1 (split-K) each program also owns one slice of K and writes fp32 partial sums
(S, M, N) that the consumer adds in a fixed order (the add_norm kernel after o and down): a long-K
GEMM's few column blocks otherwise walk K one step after another while most SMs idle.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.norms_triton import activation
from kernels.pdl import launch_options, prefetch_l2, prefetch_l2_rows, wait_for_previous

ROWS = 64  # the one row tile: every M <= 64 runs the same code, so reductions never change order


@triton.jit
def _weight_step(x, W, offs_n, n_ok, k0, offs_k, K, stride_wn, acc, DOT_FP32: tl.constexpr, IEEE: tl.constexpr):
    # acc += x @ W[offs_n, k0 : k0 + BLOCK_K]ᵀ
    k_ok = (k0 + offs_k) < K
    w = tl.load(W + offs_n[:, None] * stride_wn + (k0 + offs_k)[None, :], mask=n_ok[:, None] & k_ok[None, :],
                other=0.0)
    if DOT_FP32:
        w = w.to(tl.float32)
    if IEEE:  # fp32 weights: full fp32 products, not TF32
        return acc + tl.dot(x, tl.trans(w), input_precision="ieee")
    return acc + tl.dot(x, tl.trans(w))


@triton.jit
def _skinny_linear(
    X, W, Y, M, N, K, KS,
    stride_xm, stride_wn, stride_ym, stride_ys,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
    IEEE: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr, LANES: tl.constexpr, ACT: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # ACT > 0: W is [gate | up] (2N rows) and Y = act(x @ gateᵀ) * (x @ upᵀ), two accumulators side by side.
    # SPLIT: program (n, s) sums K in [s*KS, (s+1)*KS) and stores fp32 partials at Y[s].
    pid = tl.program_id(0)
    k_lo = tl.program_id(1) * KS
    k_hi = tl.minimum(K, k_lo + KS)
    n_rows = tl.minimum(N - pid * BLOCK_N, BLOCK_N)
    if PREFETCH:  # this program's weights (rows, or row slices when split); fetch while the last kernel runs
        if SPLIT:
            prefetch_l2_rows(W + pid * BLOCK_N * stride_wn + k_lo, stride_wn, n_rows, k_hi - k_lo, BLOCK_N, LANES)
        else:
            prefetch_l2(W + pid * BLOCK_N * stride_wn, n_rows * K, LANES)
            if ACT:
                prefetch_l2(W + (N + pid * BLOCK_N) * stride_wn, n_rows * K, LANES)
    wait_for_previous(PDL)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        # -- one K step: the rows' slice of x, then this program's weight rows
        k_ok = (k0 + offs_k) < k_hi
        x = tl.load(X + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)
        if DOT_FP32:
            x = x.to(tl.float32)
        acc = _weight_step(x, W, offs_n, n_ok, k0, offs_k, k_hi, stride_wn, acc, DOT_FP32, IEEE)
        if ACT:
            acc_up = _weight_step(x, W, N + offs_n, n_ok, k0, offs_k, k_hi, stride_wn, acc_up, DOT_FP32, IEEE)
    out = Y + tl.program_id(1) * stride_ys + offs_m[:, None] * stride_ym + offs_n[None, :]
    if SPLIT:
        tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])
    else:
        dt = Y.dtype.element_ty
        y = acc.to(dt)
        if ACT:  # rounded where the unfused GEMM + act_mul round: each product, then act(gate)
            a = activation(y.to(tl.float32), ACT == 1)
            y = (a.to(dt).to(tl.float32) * acc_up.to(dt).to(tl.float32)).to(dt)
        tl.store(out, y, mask=m_ok[:, None] & n_ok[None, :])


ACTS = {"gelu_tanh": 1, "silu": 2}


def skinny_linear_triton(
    x: torch.Tensor,  # (M, K), M <= 64
    weight: torch.Tensor,  # (N, K)
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    act: str | None = None,
    splits: int = 1,
    partials: bool = False,
) -> torch.Tensor:  # (M, N) in x's dtype, (M, N / 2) with `act`, (S, M, N) fp32 partials with splits > 1
    """x @ weightᵀ; with `act` ('gelu_tanh' or 'silu') the weight is a fused [gate | up] and the result
    act(x @ gateᵀ) * (x @ upᵀ), the MLP's activation done in the GEMM's epilogue. With `splits` > 1, K is
    cut into that many slices (each a whole number of K steps; fewer if K is short) and the result is
    their fp32 partial products (S, M, N), to be summed by the consumer (`partials`: that form always)."""
    M, K = x.shape
    N, Kw = weight.shape
    assert K == Kw, (x.shape, weight.shape)
    assert act is None or (act in ACTS and N % 2 == 0), (act, N)
    assert splits >= 1 and not (act and splits > 1), "the gated epilogue needs whole sums"
    N = N // 2 if act else N  # output columns
    rows = 16 if x.device.type == "cpu" else ROWS  # the interpreter runs a smaller tile (tests only)
    assert M <= rows, f"skinny_linear takes at most {rows} rows here, not {M}"
    assert x.stride(1) == 1 and weight.stride(1) == 1, "the reduction axis must be contiguous"
    assert x.dtype == weight.dtype and x.device == weight.device
    interpret = x.device.type == "cpu"
    # narrow outputs: more programs in flight (a gated program reads two 16-row slices)
    bn = block_n or (16 if interpret or act or N <= 2048 else 32)
    if interpret:
        bk, stages = block_k or 32, num_stages or 1
    else:
        bk, stages = _pipeline(x.device, bn, K, x.element_size(), bool(act), block_k, num_stages)
    split = partials or splits > 1  # fp32 partials out, even of one slice
    ks = triton.cdiv(triton.cdiv(K, splits), bk) * bk if split else K  # K per program, whole K steps
    s = triton.cdiv(K, ks)
    if split:  # no deeper pipeline than a slice has steps: its shared memory would cost CTAs per SM
        stages = max(1, min(stages, ks // bk))
    y = torch.empty(s, M, N, dtype=torch.float32, device=x.device) if split else \
        torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    warps = num_warps or 4
    launch = launch_options(x)
    elem = weight.element_size()
    prefetch = launch["PDL"] and weight.is_contiguous() and weight.data_ptr() % 16 == 0 and K * elem % 16 == 0 \
        and ks * elem % 16 == 0 and 32 * warps >= bn
    _skinny_linear[(triton.cdiv(N, bn), s)](
        x, weight, y, M, N, K, ks,
        x.stride(0), weight.stride(0), y.stride(-2), y.stride(0) if split else 0,
        BLOCK_M=rows, BLOCK_N=bn, BLOCK_K=bk,
        DOT_FP32=interpret and x.dtype == torch.bfloat16, IEEE=x.dtype == torch.float32,
        PREFETCH=prefetch, LANES=32 * warps, ACT=ACTS[act] if act else 0, SPLIT=split,
        num_warps=warps, num_stages=stages, **launch,
    )
    return y


SMEM_SLACK = 8 << 10  # bytes Triton may need beyond the pipelined tiles (barriers, layout changes)


def _pipeline(device: torch.device, bn: int, K: int, elem: int, gated: bool, block_k: int | None,
              num_stages: int | None) -> tuple[int, int]:
    """(BLOCK_K, stages): the H200 sweep's choice in a PDL chain (bench/linear_bench.py --sweep: 4 stages,
    256-wide K steps for long rows), cut down until the pipelined tiles fit the GPU's shared memory
    (227 KB on Hopper data-centre parts, about 99 KB on consumer ones)."""
    limit = _smem_per_block(device.index if device.index is not None else torch.cuda.current_device())
    widths = [block_k] if block_k else [256 if K >= 2048 else 128, 128, 64, 32]
    for stages in [num_stages] if num_stages else [4, 3, 2]:
        for bk in widths:
            tile = (ROWS + bn * (2 if gated else 1)) * bk * elem
            if stages * tile + SMEM_SLACK <= limit:
                return bk, stages
    return widths[-1], num_stages or 2


@functools.lru_cache(maxsize=8)
def _smem_per_block(device_index: int) -> int:
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)
