"""The chosen experts' products read by index on the device (kernels/moe_triton.py) against the PyTorch reference,
each pair exactly the dense decode kernel's product of its row and expert, and the rows' weighted sums."""
from __future__ import annotations

import pytest
import torch

from kernels import triton_available
from kernels.moe import experts_linear, weighted_rows
from kernels.quant_linear import int4_linear, int8_linear
from tests.kernels.test_quant_linear import DEVICE, ON_GPU, _int4

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")
pytestmark = pytest.mark.gpu
E = 5
# (N, K): a tiled int4 shape (N a multiple of 16), a row-major one, a K off the 128 chunk
SHAPES = [(1536, 2048), (100, 768), (2048, 1056)] if ON_GPU else [(48, 64), (20, 96)]
DTYPE = torch.bfloat16 if ON_GPU else torch.float32


def _stacked(fmt: str, n: int, k: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(n + k)
    if fmt == "int4":
        parts = [_int4(n, k, seed=e)[:2] for e in range(E)]
        return {"words": torch.stack([w for w, _ in parts]), "pairs": torch.stack([p for _, p in parts])}
    if fmt == "int8":
        return {"codes": torch.randint(-127, 128, (E, n, k), dtype=torch.int8, generator=g).to(DEVICE),
                "scale": (torch.rand(E, n, generator=g) * 0.02).to(torch.bfloat16).to(DEVICE)}
    return {"weight": (torch.randn(E, n, k, generator=g) * 0.05).to(DTYPE).to(DEVICE)}


def _one(fmt: str, stacked: dict[str, torch.Tensor], e: int, x: torch.Tensor) -> torch.Tensor:
    """The dense decode kernel's product of x with expert e."""
    if fmt == "int4":
        return int4_linear(x, stacked["words"][e], stacked["pairs"][e], impl="triton")
    if fmt == "int8":
        return int8_linear(x, stacked["codes"][e], stacked["scale"][e], impl="triton")
    return None


@needs_triton
@pytest.mark.parametrize("fmt", ["int4", "int8", "bf16"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_pairs_match_reference_and_the_dense_kernel(fmt, n, k):
    stacked = _stacked(fmt, n, k)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(k)).to(DTYPE).to(DEVICE)
    experts = torch.tensor([4, 0, 0, 2, 4, 1], device=DEVICE)  # rows 0, 0, 1, 1, 2, 2 (x_div 2): repeats, any order
    got = experts_linear(x, fmt, stacked, experts, 2, impl="triton")
    want = experts_linear(x, fmt, stacked, experts, 2, impl="reference")
    tol = 2e-2 if DTYPE == torch.bfloat16 else 1e-4
    torch.testing.assert_close(got.float(), want.float(), atol=tol * want.float().abs().max().item(), rtol=tol)
    for p, e in enumerate(experts.tolist()):
        dense = _one(fmt, stacked, e, x[p // 2:p // 2 + 1])
        if dense is not None:  # one row through the same 16-row dots: the same bits
            assert torch.equal(got[p], dense[0]), (p, e)
    alone = experts_linear(x[:1], fmt, stacked, experts[:2], 2, impl="triton")
    assert torch.equal(alone, got[:2])  # a pair's result does not depend on the step's other pairs


@needs_triton
def test_weighted_rows_sum_in_order():
    y = torch.randn(12, 300, generator=torch.Generator().manual_seed(1)).to(DTYPE).to(DEVICE)
    w = torch.rand(3, 4, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    got = weighted_rows(y, w, impl="triton")
    torch.testing.assert_close(got.float(), weighted_rows(y, w, impl="reference").float(), atol=1e-5, rtol=1e-5)
    assert torch.equal(weighted_rows(y[4:8], w[1:2], impl="triton"), got[1:2])
