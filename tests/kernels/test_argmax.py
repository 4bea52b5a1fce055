"""argmax_rows (Triton, one launch with atomics) against torch.argmax: ties, NaN, -inf, any width."""

from __future__ import annotations

import pytest
import torch

from kernels import triton_available
from kernels.argmax import argmax_rows

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")
pytestmark = pytest.mark.gpu  # run on the GPU when there is one (`make test-gpu`)


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


@needs_triton
def test_step_advance_hands_ids_to_the_host_and_moves_the_table_on():
    """Rows 0-2 decode (their segment is the row alone); row 3 pads. Two steps in a row: each real row's
    id lands at host ring slot position % HOST_RING, its position, kv_end and write slots move on by one
    (slot = storage row * columns + column, ring kinds wrapping); the padding row stays as it was."""
    from kernels.argmax_triton import ArgmaxScratch, argmax_rows_triton
    from kernels.step_advance import HOST_RING, StepAdvance, host_ring

    columns, cols, rings = 5, [3, 0, 2], [0, 8]
    start = [10, 5, 7]
    seq_info = torch.tensor([[0, 1, 3, 11], [1, 1, 0, 6], [2, 1, 2, 8], [0, 0, 4, 0]], dtype=torch.int32,
                            device=DEVICE)
    positions = torch.tensor(start + [0], device=DEVICE)
    slots = torch.full((2, 6), 4, dtype=torch.int64, device=DEVICE)  # kinds x rows (+ slack), scratch = 4
    step = StepAdvance(host_ring(4), seq_info, positions, slots, torch.tensor(rings, device=DEVICE), columns)
    scratch = ArgmaxScratch(4, DEVICE)
    for n in range(2):
        x = _logits(4, 3000, torch.float32, seed=n)
        ids = argmax_rows_triton(x, scratch, step=step, block=1024)
        if ON_GPU:
            torch.cuda.synchronize()
        assert ids.tolist() == x.argmax(-1).tolist()
        for r in range(3):
            pos = start[r] + n
            assert step.host_ids[pos % HOST_RING, r].item() == ids[r].item()
            assert positions[r].item() == pos + 1 and seq_info[r, 3].item() == pos + 2
            assert slots[0, r].item() == (pos + 1) * columns + cols[r]
            assert slots[1, r].item() == ((pos + 1) % rings[1]) * columns + cols[r]
        assert positions[3].item() == 0 and seq_info[3].tolist() == [0, 0, 4, 0]
        assert slots[:, 3:].eq(4).all()
