"""The AMX product over Q4_K/Q5_K super-blocks (kernels/cpu/amxkgemm.c): its layout round-trips the file's bytes, it
matches the float64 reference, a row's result does not depend on its batch (a few rows take the vector path, more the
tiles: the same bits either way), and a loaded matrix in this layout multiplies, looks rows up and decodes a model's
sessions as they decode alone. Runs where the tiles do (Sapphire Rapids and later Xeons); the layout tests everywhere."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.cpu_matmul import random_superblocks
from engine.quant.block_codes import superblock_rows
from engine.quant.weight import superblocks
from kernels.cpu_kgemm import amxkgemm, kgemm_reference, tile
from kernels.cpu_native import amx_ready
from kernels.kquant_layout import BYTES, natural_codes, tile_superblocks, untile_superblocks

needs_amx = pytest.mark.skipif(not amx_ready(), reason="no AMX tiles here")
TYPES = ["Q4_K", "Q5_K"]


def _raw(type_name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    return random_superblocks(type_name, n, k, np.random.default_rng(seed)).numpy()


def _exact_activations(rows: int, k: int, seed: int) -> torch.Tensor:
    """Rows that quantize per 32 without a rounding tie: integers in -127..127 (127 in each block) times a scale."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (rows, k // 32, 32), generator=g).float()
    a[..., 0] = 127.0
    return (a * torch.rand(rows, k // 32, 1, generator=g).add(0.5)).reshape(rows, k)


def _file_reference(x: torch.Tensor, raw: np.ndarray, type_name: str) -> torch.Tensor:
    return kgemm_reference(x, torch.from_numpy(raw), type_name, lambda held, _: held)


@pytest.mark.parametrize("type_name", TYPES)
def test_layout_round_trips_and_holds_a_group_of_16_columns_together(type_name):
    raw = _raw(type_name, 48, 512, seed=1)
    held = tile_superblocks(raw, type_name)
    assert held.shape == raw.shape  # the file's bytes, regrouped
    np.testing.assert_array_equal(untile_superblocks(held, type_name), raw)
    group, sb, cols = 1, 1, slice(16, 32)  # the second group's second super-block
    cell = held.reshape(3, 2, 16 * BYTES[type_name])[group, sb]
    file_blocks = raw.reshape(48, 2, BYTES[type_name])[cols, sb]
    np.testing.assert_array_equal(cell[:32].reshape(16, 2), file_blocks[:, 0:2])  # d, column by column
    np.testing.assert_array_equal(cell[64:256].reshape(12, 16), file_blocks[:, 4:16].T)  # packed scales' byte k
    codes = natural_codes(file_blocks[None], type_name)[0]  # (16 columns, 256)
    at = 256 + (512 if type_name == "Q5_K" else 0)
    pair = cell[at + 512:at + 1024].reshape(8, 16, 4)  # sub-blocks 2 (low nibbles) and 3 (high)
    np.testing.assert_array_equal(pair & 0x0F, (codes[:, 64:96].reshape(16, 8, 4) & 0x0F).transpose(1, 0, 2))
    np.testing.assert_array_equal(pair >> 4, (codes[:, 96:128].reshape(16, 8, 4) & 0x0F).transpose(1, 0, 2))


@needs_amx
@pytest.mark.parametrize("type_name", TYPES)
def test_the_librarys_tiling_is_the_layouts(type_name):
    raw = _raw(type_name, 64, 768, seed=5)
    np.testing.assert_array_equal(tile(raw, type_name, impl="native").numpy(), tile_superblocks(raw, type_name))


@needs_amx
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 4, 8, 9, 16, 17, 40])
@pytest.mark.parametrize("k", [256, 768])
def test_product_matches_its_reference(type_name, rows, k):
    raw = _raw(type_name, 64, k, seed=rows)
    held = torch.from_numpy(tile_superblocks(raw, type_name))
    x = _exact_activations(rows, k, seed=k + rows)
    ref = _file_reference(x, raw, type_name)
    got = amxkgemm(x, held, type_name, impl="native")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    torch.testing.assert_close(amxkgemm(x, held, type_name, impl="reference"), ref)


@needs_amx
@pytest.mark.parametrize("type_name", TYPES)
def test_a_row_gives_the_same_bits_alone_and_in_any_batch(type_name):
    """Up to 8 rows run on the vector units, more on the tiles: both must give each row exactly the same sum."""
    raw = _raw(type_name, 128, 512, seed=3)
    held = torch.from_numpy(tile_superblocks(raw, type_name))
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(2)) * 3
    batched = amxkgemm(x, held, type_name, impl="native")
    for r in range(40):
        assert torch.equal(amxkgemm(x[r:r + 1], held, type_name, impl="native")[0], batched[r]), r
    for lo, hi in ((0, 3), (3, 11), (11, 24), (24, 40)):  # vector calls, tile calls, a part tile, across the paths
        assert torch.equal(amxkgemm(x[lo:hi], held, type_name, impl="native"), batched[lo:hi]), (lo, hi)


@needs_amx
def test_bias_is_added_after_the_sums():
    raw = _raw("Q4_K", 32, 256)
    held = torch.from_numpy(tile_superblocks(raw, "Q4_K"))
    x, bias = torch.randn(12, 256), torch.randn(32)
    for rows in (x[:2], x):  # both paths
        assert torch.equal(amxkgemm(rows, held, "Q4_K", bias, impl="native"),
                           amxkgemm(rows, held, "Q4_K", impl="native") + bias)


@needs_amx
@pytest.mark.parametrize("type_name", TYPES)
def test_a_loaded_matrix_takes_the_tiles_and_still_looks_rows_up(type_name):
    raw = _raw(type_name, 64, 512, seed=4)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    m = superblocks(raw, type_name, order)
    assert m.code_layout.tiles and m.code_layout.raw == type_name
    assert m.nbytes() == raw.nbytes  # the file's bytes
    file_rows = raw[order.numpy()]
    ids = torch.tensor([5, 0, 63, 17, 17])
    np.testing.assert_array_equal(m.rows(ids).numpy(), superblock_rows(file_rows[ids.numpy()], type_name))
    np.testing.assert_array_equal(m.file_blocks(), file_rows)
    x = torch.randn(6, 512)
    torch.testing.assert_close(m(x), _file_reference(x, file_rows, type_name), rtol=1e-5, atol=1e-4)


def test_a_matrix_keeps_rows_without_whole_groups_with_amx_off_or_as_an_expert(monkeypatch):
    raw = _raw("Q4_K", 40, 256)
    assert not superblocks(raw, "Q4_K").code_layout.tiles  # 40 columns: not whole groups of 16
    assert not superblocks(raw[:32], "Q4_K", tiles=False).code_layout.tiles
    monkeypatch.setenv("PARLEY_AMX", "0")
    m = superblocks(raw[:32], "Q4_K")
    assert not m.code_layout.tiles and m.nbytes() == 32 * BYTES["Q4_K"]


@pytest.fixture(scope="module")
def q4_k_m_path(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama.cpp's quantizer writes the file")
    from bench.synthetic_gguf import synthetic_gguf

    return synthetic_gguf("llama-draft", tmp_path_factory.mktemp("q4_k_m"), kind="Q4_K_M")


@needs_amx
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_a_q4_k_m_model_on_the_tiles_gives_each_session_its_tokens_alone(q4_k_m_path, layout):
    """A tiny Q4_K_M llama whose Q4_K matrices take the tiles: greedy sessions batched (prefills of many rows on the
    tiles, decode rows on the vector path) give exactly the tokens each gives alone."""
    from engine.loading.loader import LoadOptions, load_model
    from tests.support.engine_helpers import assert_staggered_alone

    lm = load_model(q4_k_m_path, LoadOptions(weights="quantized"))
    assert_staggered_alone(lm, layout, min_tiled={"Q4_K"})
