"""kv_write (Triton) against index_copy_ into the flat [rows * C] slot view."""

from __future__ import annotations

import pytest
import torch

from kernels import kv_write, kv_write_reference, triton_available

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")
pytestmark = pytest.mark.gpu  # run on the GPU when there is one (`make test-gpu`)


def make_cache(rows: int, C: int, Hkv: int, D: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows * C)
    k = torch.randn(rows, C, Hkv, D, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(rows, C, Hkv, D, generator=gen).to(dtype).to(DEVICE)
    return k, v


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("Hkv,D", [(1, 256), (2, 64), (3, 128), (4, 80)])
def test_matches_reference(dtype: torch.dtype, Hkv: int, D: int) -> None:
    rows, C = (4096, 65) if ON_GPU else (12, 5)
    T = 300 if ON_GPU else 9
    k_cache, v_cache = make_cache(rows, C, Hkv, D, dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(rows * C)[:T].to(DEVICE)  # distinct slots: the result is exact
    k = torch.randn(T, Hkv, D, device=DEVICE).to(dtype)
    v = torch.randn(T, Hkv, D, device=DEVICE).to(dtype)
    kv_write(k_cache, v_cache, k, v, slots, impl="triton")
    kv_write_reference(k_ref, v_ref, k, v, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    row, col = slots // C, slots % C
    assert torch.equal(k_cache[row, col], k) and torch.equal(v_cache[row, col], v)


@needs_triton
def test_casts_to_storage_dtype_and_takes_strided_inputs() -> None:
    rows, C, Hkv, D = 8, 3, 2, 64
    k_cache, v_cache = make_cache(rows, C, Hkv, D, torch.float16)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kv = torch.randn(5, 2, Hkv, D, device=DEVICE)  # fp32, K and V interleaved (a fused projection)
    k, v = kv[:, 0], kv[:, 1]
    slots = torch.tensor([0, 7, 8, 23, 12], device=DEVICE)
    kv_write(k_cache, v_cache, k, v, slots, impl="triton")
    kv_write_reference(k_ref, v_ref, k, v, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@needs_triton
def test_padded_writes_to_scratch_column() -> None:
    # Padding tokens all write the scratch column; only real columns must match exactly.
    rows, C, Hkv, D = 6, 4, 1, 64
    k_cache, v_cache = make_cache(rows, C, Hkv, D, torch.float32)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    scratch = C - 1
    slots = torch.tensor([0 * C + 1, 1 * C + 1, scratch, scratch, 2 * C + 0], device=DEVICE)
    k = torch.randn(5, Hkv, D, device=DEVICE)
    v = torch.randn(5, Hkv, D, device=DEVICE)
    kv_write(k_cache, v_cache, k, v, slots, impl="triton")
    kv_write_reference(k_ref, v_ref, k, v, slots)
    assert torch.equal(k_cache[:, :scratch], k_ref[:, :scratch])
    assert torch.equal(v_cache[:, :scratch], v_ref[:, :scratch])


@needs_triton
def test_empty_step_writes_nothing() -> None:
    k_cache, v_cache = make_cache(4, 2, 1, 64, torch.float32)
    before = k_cache.clone()
    empty = torch.zeros(0, 1, 64, device=DEVICE)
    kv_write(k_cache, v_cache, empty, empty, torch.zeros(0, dtype=torch.int64, device=DEVICE), impl="triton")
    assert torch.equal(k_cache, before)


def test_reference_writes_slot_row_times_columns_plus_column() -> None:
    rows, C, Hkv, D = 5, 3, 1, 4
    k_cache = torch.zeros(rows, C, Hkv, D)
    v_cache = torch.zeros(rows, C, Hkv, D)
    k = torch.arange(8.0).view(2, 1, 4)
    kv_write(k_cache, v_cache, k, -k, torch.tensor([3 * C + 2, 0 * C + 1]), impl="reference")
    assert torch.equal(k_cache[3, 2], k[0]) and torch.equal(k_cache[0, 1], k[1])
    assert torch.equal(v_cache[3, 2], -k[0]) and k_cache.count_nonzero() == 7  # k[1] has one zero
