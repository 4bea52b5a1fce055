"""The chosen experts' products read by index on the device (kernels/moe_triton.py) against the PyTorch reference,
each pair exactly the dense decode kernel's product of its row and expert, and the rows' weighted sums."""
from __future__ import annotations

import pytest
import torch

from kernels import triton_available
from kernels.moe import experts_linear, weighted_rows
from kernels.quant_linear import int4_linear, int8_linear
from tests.kernels.test_quant_linear import DEVICE, ON_GPU, _fp4, _int4

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")
pytestmark = pytest.mark.gpu
E = 5
# (N, K): a tiled int4 shape (N a multiple of 16), a row-major one, a K off the 128 chunk
SHAPES = [(1536, 2048), (100, 768), (2048, 1056)] if ON_GPU else [(48, 64), (20, 96)]
DTYPE = torch.bfloat16 if ON_GPU else torch.float32


def _stacked(fmt: str, n: int, k: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(n + k)
    if fmt in ("int4", "fp4"):
        parts = [_int4(n, k, seed=e)[:2] if fmt == "int4" else _fp4(n, k, seed=e) for e in range(E)]
        return {"words": torch.stack([w for w, _ in parts]), "pairs": torch.stack([p for _, p in parts])}
    if fmt == "int8":
        return {"codes": torch.randint(-127, 128, (E, n, k), dtype=torch.int8, generator=g).to(DEVICE),
                "scale": (torch.rand(E, n, generator=g) * 0.02).to(torch.bfloat16).to(DEVICE)}
    return {"weight": (torch.randn(E, n, k, generator=g) * 0.05).to(DTYPE).to(DEVICE)}


def _one(fmt: str, stacked: dict[str, torch.Tensor], e: int, x: torch.Tensor) -> torch.Tensor:
    """The dense decode kernel's product of x with expert e."""
    if fmt in ("int4", "fp4"):
        return int4_linear(x, stacked["words"][e], stacked["pairs"][e], impl="triton")
    if fmt == "int8":
        return int8_linear(x, stacked["codes"][e], stacked["scale"][e], impl="triton")
    return None


@needs_triton
@pytest.mark.parametrize("fmt", ["int4", "fp4", "int8", "bf16"])
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


@needs_triton
def test_pair_tiles_group_each_experts_pairs_by_sixteen():
    from kernels.moe import pair_tiles, tile_capacity

    experts = torch.tensor([3, 0, 3, 1] * 10 + [3] * 9, device=DEVICE)  # expert 3: 29 pairs, two tiles
    got = pair_tiles(experts, E, impl="triton")
    want = pair_tiles(experts.cpu(), E, impl="reference")
    assert torch.equal(got.order.cpu(), want.order) and torch.equal(got.experts.cpu(), want.experts)
    assert torch.equal(got.starts.cpu(), want.starts)
    assert got.capacity == tile_capacity(len(experts), E)
    # experts 0, 1 (10 pairs each), then 3's 29 in 16 + 13; the rest empty (start = P)
    assert want.starts.tolist() == [0, 10, 20, 36] + [len(experts)] * (got.capacity - 3)
    assert want.order[20:].tolist() == [i for i, e in enumerate(experts.tolist()) if e == 3]
    for n in (300, 1500):  # compared in chunks; past TABLE_PAIRS through torch's sort on the device
        many = torch.randint(0, 40, (n,), generator=torch.Generator().manual_seed(8)).to(DEVICE)
        got, want = pair_tiles(many, 40, impl="triton"), pair_tiles(many.cpu(), 40, impl="reference")
        assert all(torch.equal(a.cpu(), b) for a, b in zip((got.order, got.experts, got.starts),
                                                            (want.order, want.experts, want.starts)))
        counts = torch.bincount(many.cpu(), minlength=40)
        assert int((want.starts < n).sum()) == int(((counts + 15) // 16).sum())  # ceil(count / 16) tiles an expert


@needs_triton
@pytest.mark.parametrize("fmt", ["int4", "fp4", "int8", "bf16"])
def test_grouped_tiles_give_each_pair_its_own_bits(fmt):
    """An expert's pairs side by side in one tile (more than 16 of one expert: two tiles) give every row the bits it
    has alone in a tile on the GPU (each row its own row of the MMA): a step may group or not without changing a
    token. The interpreter's dots are NumPy's, whose rounding may depend on a row's place: there, to an ulp."""
    from kernels.moe import pair_tiles

    n, k = SHAPES[0]
    stacked = _stacked(fmt, n, k)
    x = torch.randn(25, k, generator=torch.Generator().manual_seed(5)).to(DTYPE).to(DEVICE)
    experts = torch.randint(0, E, (50,), generator=torch.Generator().manual_seed(6)).to(DEVICE)
    experts[::2] = 2  # expert 2 takes over 16 pairs
    tiles = pair_tiles(experts, E)
    grouped = experts_linear(x, fmt, stacked, experts, 2, tiles=tiles, impl="triton")
    single = experts_linear(x, fmt, stacked, experts, 2, impl="triton")
    if ON_GPU:
        assert torch.equal(grouped, single)
    else:
        torch.testing.assert_close(grouped, single, atol=1e-6 * single.abs().max().item(), rtol=1e-6)
    want = experts_linear(x, fmt, stacked, experts, 2, impl="reference")
    tol = 2e-2 if DTYPE == torch.bfloat16 else 1e-4
    torch.testing.assert_close(grouped.float(), want.float(), atol=tol * want.float().abs().max().item(), rtol=tol)
