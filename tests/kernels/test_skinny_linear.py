"""skinny_linear (Triton) against F.linear; and a row's result does not depend on the row count."""

from __future__ import annotations

import pytest
import torch

from kernels import triton_available
from kernels.linear import linear, linear_act, linear_partials, linear_reference

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
MAX_M = 64 if ON_GPU else 16

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")
pytestmark = pytest.mark.gpu  # run on the GPU when there is one (`make test-gpu`)
# Gemma-3-270M's decode GEMMs on the GPU (fused qkv, fused gate/up, o, down); odd sizes on both.
SHAPES = [(1536, 640), (4096, 640), (640, 1024), (640, 2048), (100, 200)] if ON_GPU else [(48, 64), (20, 40), (33, 96)]


def _data(m: int, n: int, k: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    return x, w


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8, MAX_M])
def test_matches_reference(dtype, n, k, m):
    x, w = _data(m, n, k, dtype)
    got = linear(x, w, impl="triton")
    ref = linear_reference(x.double(), w.double())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert got.shape == (m, n) and got.dtype == dtype
    assert (got.double() - ref).abs().max() <= tol * ref.abs().max()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("splits", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 5, MAX_M])
def test_split_k_partials_sum_to_the_product(dtype, n, k, splits, m):
    """Split over K: at most `splits` fp32 partials, each a whole number of K steps, summing to x @ wᵀ."""
    x, w = _data(m, n, k, dtype)
    parts = linear_partials(x, w, splits, impl="triton")
    ref = linear_reference(x.double(), w.double())
    assert parts.dtype == torch.float32 and parts.shape[1:] == (m, n) and 1 <= parts.shape[0] <= splits
    if splits > 1 and k >= 64 * splits:
        assert parts.shape[0] > 1
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
    assert (parts.double().sum(0) - ref).abs().max() <= tol * ref.abs().max()


@pytest.mark.skipif(not ON_GPU, reason="the interpreter's tl.dot is numpy BLAS, whose order changes with the shape")
@pytest.mark.parametrize("n,k", SHAPES[:2])
@pytest.mark.parametrize("act", [None, "gelu_tanh"])
def test_row_result_independent_of_row_count(n, k, act):
    """The same row alone, among 7 others or among MAX_M - 1 gives the same bits (gated too)."""
    x, w = _data(MAX_M, n, k, torch.bfloat16)

    def run(rows: torch.Tensor) -> torch.Tensor:
        return linear(rows, w, impl="triton") if act is None else linear_act(rows, w, act, impl="triton")

    full = run(x)
    for m in (1, 8, MAX_M // 2):
        if act is None:  # split-K partials too
            assert torch.equal(linear_partials(x[:m], w, 4), linear_partials(x, w, 4)[:, :m])
        assert torch.equal(run(x[:m]), full[:m])
        assert torch.equal(run(x[m - 1 : m])[0], full[m - 1])


def test_bad_impl_and_too_many_rows():
    x, w = _data(4, 8, 16, torch.float32)
    with pytest.raises(ValueError):
        linear(x, w, impl="fast")
    if triton_available():
        with pytest.raises(AssertionError, match="rows"):
            linear(torch.zeros(MAX_M + 1, 16, device=DEVICE), w, impl="triton")


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32])
@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("m", [1, 5, MAX_M])
def test_gated_epilogue_matches_gemm_then_act_mul(dtype, act, m):
    """act(x @ gateᵀ) * (x @ upᵀ) from one launch == the GEMM, then act_mul's reference."""
    n, k = SHAPES[1]  # a fused [gate | up]: n / 2 outputs
    x, w = _data(m, n, k, dtype)
    got = linear_act(x, w, act, impl="triton")
    ref = linear_act(x, w, act, impl="reference")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert got.shape == (m, n // 2) and got.dtype == dtype
    assert (got.float() - ref.float()).abs().max() <= tol * ref.float().abs().max()


@pytest.mark.parametrize("limit,elem,gated,expect", [
    (232448, 2, False, (256, 4)),  # H200, bf16: the swept setting
    (232448, 4, False, (128, 4)),  # fp32 tiles that wide would not fit: narrower K steps
    (101376, 2, False, (128, 4)),  # a consumer GPU's ~99 KB
    (101376, 2, True, (64, 4)),    # gate and up tiles side by side
    (49152, 4, True, (32, 3)),     # then fewer stages
])
def test_pipeline_fits_shared_memory(monkeypatch, limit, elem, gated, expect):
    """The K step and stage count shrink until the pipelined tiles fit the GPU's shared memory."""
    skinny = pytest.importorskip("kernels.skinny_linear_triton")
    monkeypatch.setattr(skinny, "_smem_per_block", lambda index: limit)
    bk, stages = skinny._pipeline(torch.device("cuda", 0), 16, 2048, elem, gated, None, None)
    assert (bk, stages) == expect
    assert stages * (skinny.ROWS + 16 * (2 if gated else 1)) * bk * elem + skinny.SMEM_SLACK <= limit
