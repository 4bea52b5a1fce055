"""argmax_rows (Triton, one launch with atomics) against torch.argmax: ties, NaN, -inf, any width."""

from __future__ import annotations

import pytest
import torch

from kernels import triton_available
from kernels.argmax import argmax_rows

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")


def _logits(rows: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, width, generator=g) * 4).to(dtype).to(DEVICE)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(1, 5000), (3, 2048), (7, 300), (2, 262144 if ON_GPU else 9000)])
def test_matches_torch_argmax(dtype, rows, width):
    x = _logits(rows, width, dtype, seed=rows + width)
    assert torch.equal(argmax_rows(x, impl="triton"), x.argmax(-1))


@needs_triton
def test_ties_take_the_first_index_and_scratch_resets():
    """Equal maxima in different blocks: the lowest index wins; the same scratch serves the next call."""
    from kernels.argmax_triton import ArgmaxScratch, argmax_rows_triton

    scratch = ArgmaxScratch(4, DEVICE)
    x = torch.full((4, 6000), -3.0, device=DEVICE)
    x[0, [4100, 17, 5999]] = 2.5  # three blocks hold the maximum
    x[1, [2047, 2048]] = 1.0  # either side of a block edge
    x[2] = float("-inf")  # nothing above -inf: index 0, as torch
    x[3, 3000] = float("nan")  # NaN counts as the maximum, as torch
    for block in (2048, 2048, 1024, 8192):  # several blocks per row; the same scratch each time
        got = argmax_rows_triton(x, scratch, block=block)
        assert got.tolist() == [17, 2047, 0, 3000] == x.argmax(-1).tolist()
    assert scratch.counts.eq(0).all() and scratch.keys.eq(torch.iinfo(torch.int64).min).all()


@needs_triton
def test_negative_values_order_correctly():
    x = torch.tensor([[-5.0, -0.25, -7.0, -0.5], [-0.0, 0.0, -1e-30, 1e-30]], device=DEVICE)
    assert argmax_rows(x, impl="triton").tolist() == x.argmax(-1).tolist()
