"""The AMX product (kernels/cpu/amxgemm.c) over byte codes in groups of 16 columns: its layout round-trips, it
matches the float64 reference, a row's result does not depend on its batch (a few rows take the vector path, more the
tiles: the same bits either way), and a loaded matrix in this layout multiplies, looks rows up and fuses as the
vector kernels' layout does. Runs where the tiles do (Sapphire Rapids and later Xeons); the layout tests everywhere."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.quant.block_codes import TILED, TILED_FIFTHS, CodeLayout, Codes
from engine.quant.weight import BlockRows, QuantTensor, concat_rows
from kernels.cpu_native import amx_ready
from kernels.cpu_qgemm import amxgemm, q8gemm, qgemm_reference
from kernels.kquant_layout import (interleave_units, pack_fifths, tile_codes, tile_scales, untile_codes,
                                   untile_scales)

needs_amx = pytest.mark.skipif(not amx_ready(), reason="no AMX tiles here")


def _matrix(n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Byte codes u = q + 128 (q in -127..127, as Q8_0) and fp16 scales per 32."""
    rng = np.random.default_rng(seed)
    return (rng.integers(1, 256, (n, k), dtype=np.uint8),
            rng.uniform(1e-3, 5e-2, (n, k // 32)).astype(np.float16))


def _fifths(n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Q5_0's codes as bytes u = q5 + 112 (zero 128) and fp16 scales per 32."""
    rng = np.random.default_rng(seed)
    return ((rng.integers(0, 32, (n, k)) + 112).astype(np.uint8),
            rng.uniform(1e-3, 5e-2, (n, k // 32)).astype(np.float16))


def _tiled(u: np.ndarray, s: np.ndarray, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(tile_codes(u, bits)), torch.from_numpy(tile_scales(s))


def test_tile_layout_round_trips_and_holds_a_block_of_16_columns_together():
    u, s = _matrix(48, 96)
    held = tile_codes(u)
    np.testing.assert_array_equal(untile_codes(held), u)
    five = _fifths(48, 96)[0]
    assert tile_codes(five, 5).shape == (48, 60)
    np.testing.assert_array_equal(untile_codes(tile_codes(five, 5), 5), five)
    np.testing.assert_array_equal(untile_scales(tile_scales(s)), s)
    group, block = 1, 2  # byte 64i + 4c + t of (group, block) is column 16·group + c's weight 32·block + 4i + t, signed
    cell = held.reshape(3, 3, 8, 16, 4)[group, block]
    expected = (u[16 * group:16 * group + 16, 32 * block:32 * block + 32].reshape(16, 8, 4) ^ 0x80).transpose(1, 0, 2)
    np.testing.assert_array_equal(cell, expected)


@needs_amx
@pytest.mark.parametrize("bits", [8, 5])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 15, 16, 17, 40])
@pytest.mark.parametrize("k", [32, 96, 640])
def test_amx_product_matches_its_reference(rows, k, bits):
    u, s = (_matrix if bits == 8 else _fifths)(64, k, seed=rows)
    codes, scales = _tiled(u, s, bits)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k))
    ref = qgemm_reference(x, torch.from_numpy(u), torch.from_numpy(s), None, 8, 32, 128)
    got = amxgemm(x, codes, scales, bits=bits, impl="native")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    torch.testing.assert_close(amxgemm(x, codes, scales, bits=bits, impl="reference"), ref)


@needs_amx
@pytest.mark.parametrize("bits", [8, 5])
def test_a_row_gives_the_same_bits_alone_and_in_any_batch(bits):
    """Up to 4 rows run on the vector units, more on the tiles: both must give each row exactly the same sum."""
    u, s = (_matrix if bits == 8 else _fifths)(256, 640, seed=3)
    codes, scales = _tiled(u, s, bits)
    x = torch.randn(40, 640, generator=torch.Generator().manual_seed(2)) * 3
    batched = amxgemm(x, codes, scales, bits=bits, impl="native")
    for r in range(40):
        assert torch.equal(amxgemm(x[r:r + 1], codes, scales, bits=bits, impl="native")[0], batched[r]), r
    for lo, hi in ((0, 3), (3, 7), (7, 24), (24, 40)):  # vector calls, tile calls, a part tile, across the paths
        assert torch.equal(amxgemm(x[lo:hi], codes, scales, bits=bits, impl="native"), batched[lo:hi]), (lo, hi)


@needs_amx
def test_bias_is_added_after_the_sums():
    u, s = _matrix(32, 64)
    codes, scales = _tiled(u, s)
    x, bias = torch.randn(6, 64), torch.randn(32)
    assert torch.equal(amxgemm(x, codes, scales, bias, impl="native"), amxgemm(x, codes, scales, impl="native") + bias)


@needs_amx
def test_the_vector_kernels_layout_agrees_within_rounding():
    """The units kernel sums per 16 weights in fp32, the tiles per block of 32: the same integers, rounded apart."""
    u, s = _matrix(128, 640, seed=5)
    x = torch.randn(9, 640)
    units = q8gemm(x, torch.from_numpy(interleave_units(u)), torch.from_numpy(s), impl="native")
    tiles = amxgemm(x, *_tiled(u, s), impl="native")
    torch.testing.assert_close(tiles, units, rtol=1e-5, atol=1e-5 * units.abs().max().item())


def _loaded(u: np.ndarray, s: np.ndarray, type_name: str = "Q8_0") -> QuantTensor:
    n, k = u.shape
    out = BlockRows(n, k, type_name)
    for start in range(0, n, 24):  # slices that are not whole groups of 16, as row_slices may cut them
        out.put(start, Codes(u[start:start + 24], s[start:start + 24].astype(np.float32), None))
    return out.done()


@needs_amx
@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_0"])
def test_a_loaded_matrix_takes_the_tiles_and_still_looks_rows_up(type_name):
    u, s = (_matrix if type_name == "Q8_0" else _fifths)(96, 640, seed=7)
    held = _loaded(u, s, type_name)
    assert held.code_layout == (TILED if type_name == "Q8_0" else TILED_FIFTHS)
    assert held.nbytes() == 96 * 640 * held.code_layout.bits // 8 + 96 * 20 * 2  # the units layout's bytes
    ids = torch.tensor([95, 0, 17, 17, 40])
    weights = (u.astype(np.float32) - 128) * np.repeat(s.astype(np.float32), 32, axis=1)
    np.testing.assert_array_equal(held.rows(ids).numpy(), weights[ids.numpy()])
    np.testing.assert_array_equal(held.dequantize().numpy(), weights)
    x = torch.randn(5, 640)
    bits = held.code_layout.bits
    torch.testing.assert_close(held(x), amxgemm(x, *_tiled(u, s, bits), bits=bits, impl="native"), rtol=0, atol=0)
    order = torch.randperm(96, generator=torch.Generator().manual_seed(1))  # a loader's row order (q/k heads)
    out = BlockRows(96, 640, type_name)
    out.put(0, Codes(u, s.astype(np.float32), None))
    np.testing.assert_array_equal(out.done(order).dequantize().numpy(), weights[order.numpy()])


@needs_amx
def test_a_loaded_matrix_keeps_the_vector_layout_without_whole_groups_or_with_amx_off(monkeypatch):
    u, s = _matrix(40, 640)
    assert _loaded(u, s).code_layout == CodeLayout(8, 32, 128, units=True)  # 40 rows: not whole groups of 16
    monkeypatch.setenv("PARLEY_AMX", "0")
    assert _loaded(*_matrix(48, 640)).code_layout == CodeLayout(8, 32, 128, units=True)


@needs_amx
def test_a_tiled_v_fuses_with_five_bit_q_and_k():
    """A Q8_0 v (tiles) beside Q5_0 q and k (5 bits in units) fuse as byte units: one call, the same products."""
    rng = np.random.default_rng(9)
    q5 = (rng.integers(0, 32, (32, 640)) + 112).astype(np.uint8)
    s5 = rng.uniform(1e-3, 5e-2, (32, 20)).astype(np.float16)
    five = QuantTensor("blocks", (32, 640), "Q5_0", CodeLayout(5, 32, 128, units=True),
                       codes=torch.from_numpy(pack_fifths(interleave_units(q5))), scales=torch.from_numpy(s5))
    v = _loaded(*_matrix(16, 640, seed=4))
    fused = concat_rows([five, v])
    assert fused is not None and fused.code_layout == CodeLayout(8, 32, 128, units=True)
    x = torch.randn(3, 640)
    torch.testing.assert_close(fused(x), torch.cat([five(x), v(x)], dim=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(fused.dequantize().numpy(), torch.cat([five.dequantize(), v.dequantize()]).numpy())
    tiled_five = _loaded(q5, s5, "Q5_0")  # both in the tiles' groups: they fuse there, as bytes
    fused = concat_rows([tiled_five, v])
    assert fused is not None and fused.code_layout == TILED
    torch.testing.assert_close(fused(x), torch.cat([tiled_five(x), v(x)], dim=1), rtol=0, atol=0)
    np.testing.assert_array_equal(fused.dequantize().numpy(), torch.cat([five.dequantize(), v.dequantize()]).numpy())


@needs_amx
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_a_q8_0_model_on_the_tiles_gives_each_session_its_tokens_alone(tiny_models_q8, layout):
    """A tiny Q8_0 model whose matrices take the tiles: greedy sessions batched (a prefill of many rows on the tiles,
    decode rows on the vector path) give exactly the tokens each gives alone."""
    from engine.loading.loader import LoadOptions, load_model
    from tests.support.engine_helpers import assert_staggered_alone

    lm = load_model(tiny_models_q8["llama"].gguf_path, LoadOptions(weights="quantized"))
    assert_staggered_alone(lm, layout, min_tiled=4)
