"""The quantized decode GEMMs (Triton, dequantizing in registers) against the PyTorch reference, and a row's
result does not depend on the row count (batched == alone)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.quant.gguf_blocks import Int4Groups
from engine.quant.weight import QuantTensor, pack_int4
from kernels import triton_available
from kernels.quant_linear import (int4_dequantize, int4_linear, int4_partials, int4_rows_reference, int8_linear,
                                   int8_partials)

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
MAX_M = 64 if ON_GPU else 16

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")
pytestmark = pytest.mark.gpu
# (N, K): Gemma-3-270M's fused qkv and gate/up, a long-K down, and odd N / K not a multiple of the K step
SHAPES = [(1536, 640), (2048, 640), (640, 2048), (100, 96), (4097, 1056)] if ON_GPU else [(48, 64), (20, 96), (33, 288)]


def _int4(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, Int4Groups]:
    rng = np.random.default_rng(seed)
    g = Int4Groups(rng.integers(0, 16, (n, k), dtype=np.uint8),
                   rng.uniform(0.001, 0.02, (n, k // 32)).astype(np.float32),
                   rng.normal(0, 0.02, (n, k // 32)).astype(np.float32))
    q = pack_int4(g, "Q4_K", device="cuda")  # the GPU layout, built on the CPU
    return q.words.to(DEVICE), q.pairs.to(DEVICE), g


def _mxfp4_raw(n: int, k: int, seed: int = 0) -> np.ndarray:
    """(N, K/32 · 17) bytes of MXFP4 blocks: realistic exponents (2^-17 .. 2^0 scales) and the edges 0, 1 and 128."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n, k // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(110, 128, (n, k // 32))
    edges = np.array([0, 1, 128], dtype=np.uint8)
    blocks.reshape(-1, 17)[:3, 0] = edges
    return blocks.reshape(n, -1)


def _fp4(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    from engine.quant.weight import mxfp4_words

    q = mxfp4_words(_mxfp4_raw(n, k, seed), k)
    return q.words.to(DEVICE), q.pairs.to(DEVICE)


def _x(m: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)).to(dtype).to(DEVICE)


def test_layout_dequantizes_to_the_groups_values():
    """The nibble layout holds exactly the codes and bf16 scale/zero it was built from (K padded to 128: cut off)."""
    nib, sz, g = _int4(8, 64)
    got = int4_rows_reference(nib.cpu(), sz.cpu(), torch.float32, 64)
    scale = torch.from_numpy(g.scale).bfloat16().float().repeat_interleave(32, 1)
    zero = torch.from_numpy(g.zero).bfloat16().float().repeat_interleave(32, 1)
    want = (torch.from_numpy(g.codes).float() - 8) * scale + zero
    assert torch.equal(got, want)


@needs_triton
@pytest.mark.parametrize("n,k", SHAPES)
def test_dequantize_kernel_matches_reference(n, k):
    nib, sz, _ = _int4(n, k)
    got = int4_dequantize(nib, sz, torch.float32, k, impl="triton")
    assert got.shape == (n, k) and torch.equal(got, int4_dequantize(nib, sz, torch.float32, k, impl="reference"))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32] if ON_GPU else [torch.float32])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 5, MAX_M])
def test_int4_matches_reference(dtype, n, k, m):
    nib, sz, _ = _int4(n, k)
    x = _x(m, k, dtype)
    w = int4_rows_reference(nib, sz, dtype, k).double()
    ref = x.double() @ w.t()
    got = int4_linear(x, nib, sz, impl="triton")
    assert got.shape == (m, n) and got.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-3
    assert (got.double() - ref).abs().max() <= tol * ref.abs().max()
    logits = int4_linear(x, nib, sz, out_dtype=torch.float32, impl="triton")
    assert logits.dtype == torch.float32 and (logits.double() - ref).abs().max() <= tol * ref.abs().max()


@needs_triton
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("splits", [2, 3, 8])
@pytest.mark.parametrize("m", [1, MAX_M])
def test_int4_split_k_partials_sum_to_the_product(n, k, splits, m):
    """Split over K: at most `splits` fp32 partials of whole chunks, more than one where K has the chunks."""
    nib, sz, _ = _int4(n, k)
    x = _x(m, k, torch.bfloat16 if ON_GPU else torch.float32)
    parts = int4_partials(x, nib, sz, splits, impl="triton")
    ref = x.double() @ int4_rows_reference(nib, sz, x.dtype, k).double().t()
    chunks = -(-k // 128)
    assert parts.dtype == torch.float32 and parts.shape[1:] == (m, n) and 1 <= parts.shape[0] <= min(splits, chunks)
    assert parts.shape[0] > 1 or chunks == 1
    assert (parts.double().sum(0) - ref).abs().max() <= 1e-2 * ref.abs().max()


@needs_triton
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("m", [1, MAX_M])
def test_int8_split_k_partials_sum_to_the_product(splits, m):
    """Split over K: each slice's partial scaled by its column's scale, summing to the product."""
    n, k = 40, 288  # K: 9 steps of the interpreter's 32
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8).to(DEVICE)
    scale = (torch.rand(n, generator=g) * 0.01 + 1e-4).bfloat16().to(DEVICE)
    x = _x(m, k, torch.bfloat16 if ON_GPU else torch.float32)
    parts = int8_partials(x, codes, scale, splits, impl="triton")
    ref = x.double() @ (codes.double() * scale.double()[:, None]).t()
    assert parts.dtype == torch.float32 and parts.shape == (splits, m, n)
    assert (parts.double().sum(0) - ref).abs().max() <= 1e-2 * ref.abs().max()
    # a row's fp32 partials do not depend on the rows beside it, in either row tile
    rows = int8_partials(x[:1], codes, scale, splits, impl="triton")
    assert torch.equal(rows, parts[:, :1])


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32] if ON_GPU else [torch.float32])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 5, MAX_M])
def test_int8_matches_reference(dtype, n, k, m):
    g = torch.Generator().manual_seed(n + k)
    codes = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8).to(DEVICE)
    scale = (torch.rand(n, generator=g) * 0.01 + 1e-4).bfloat16().to(DEVICE)
    x = _x(m, k, dtype)
    ref = x.double() @ (codes.double() * scale.double()[:, None]).t()
    got = int8_linear(x, codes, scale, impl="triton")
    assert got.shape == (m, n) and got.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-3
    assert (got.double() - ref).abs().max() <= tol * ref.abs().max()
    assert (int8_linear(x, codes, scale, impl="reference").double() - ref).abs().max() <= tol * ref.abs().max()


@needs_triton
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_a_row_does_not_depend_on_the_row_count(kind):
    """Batched == alone: a row's fp32 bits are the same at any M <= MAX_M (the 16-, 32-, 48- and 64-row tiles)."""
    n, k = SHAPES[0]
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    x = _x(MAX_M, k, dtype)
    if kind == "int4":
        nib, sz, _ = _int4(n, k)
        run = lambda rows: int4_linear(rows, nib, sz, out_dtype=torch.float32, impl="triton")  # noqa: E731
    else:
        codes = torch.randint(-127, 128, (n, k), generator=torch.Generator().manual_seed(1), dtype=torch.int8)
        scale = torch.full((n,), 0.01).bfloat16().to(DEVICE)
        run = lambda rows: int8_linear(rows, codes.to(DEVICE), scale, out_dtype=torch.float32,  # noqa: E731
                                       impl="triton")
    full = run(x)
    for m in (m for m in (1, 3, 9, 16, 17, 32, 33, 49) if m < MAX_M):
        assert torch.equal(run(x[:m]), full[:m]), m


def test_longer_steps_dequantize_then_multiply():
    """More rows than the decode tile: the dense path over the dequantized matrix (prefill)."""
    n, k = 48, 64
    nib, sz, _ = _int4(n, k)
    x = _x(MAX_M + 7, k, torch.float32)
    ref = x.double() @ int4_rows_reference(nib, sz, torch.float32, k).double().t()
    got = int4_linear(x, nib, sz)
    assert got.shape == (MAX_M + 7, n) and (got.double() - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_int4_k_slices_are_a_power_of_two_of_whole_chunks():
    """3 slices ran 1.1-1.6× slower than 2 or 4 on the H200 (docs/QUANTIZED.md): counts are powers of two, at least
    two chunks a slice."""
    from kernels.quant_linear_triton import int4_splits

    for n in (16, 640, 4096, 28672):
        for chunks in range(1, 130):
            s = int4_splits(n, chunks, torch.device("cpu"))
            assert s >= 1 and s & (s - 1) == 0 and (s == 1 or chunks // s >= 2), (n, chunks, s)


def test_the_row_tile_is_the_rows_rounded_up_to_sixteen():
    """A step pays one 16-row dot per 16 rows it has, not the 64-row tile's four once past 16."""
    from kernels.quant_linear_triton import ROW_TILE, _rows

    assert ROW_TILE == 16
    for m, tile in ((1, 16), (16, 16), (17, 32), (32, 32), (33, 48), (48, 48), (49, 64), (64, 64)):
        assert _rows(torch.empty(m, 8, device="meta")) == tile, m
    with pytest.raises(AssertionError):
        _rows(torch.empty(65, 8, device="meta"))



def test_tiles_above_sixteen_rows_are_wider_and_keep_a_rows_bits():
    """Above 16 rows a program owns 64 or 128 columns (H200 sweep); the tile never changes a column's K order, so a
    row's bits stay those of the one-row tile (test_a_row_does_not_depend_on_the_row_count)."""
    from kernels.quant_linear_triton import int4_tiles

    assert int4_tiles(28672, 32, rows=16) == (128, 1, 3, 2)
    assert int4_tiles(6144, 32, rows=16) == (64, 1, 3, 1)
    assert int4_tiles(2048, 64, rows=16) == (32, 1, 4, 2)
    assert int4_tiles(28672, 32, rows=64) == (128, 2, 3, 4)
    assert int4_tiles(4096, 112, rows=32) == (64, 1, 3, 4)
    assert int4_tiles(6144, 5, rows=48) == (128, 1, 3, 4)
    assert int4_tiles(128256, 32, rows=64) == int4_tiles(128256, 32, rows=1)
    from kernels.quant_linear_triton import int8_tiles

    for n in (1024, 4096, 28672, 128256):  # the int8 K step bounds its K slices: the same at every row count
        assert int8_tiles(n, rows=64)[1] == int8_tiles(n, rows=16)[1] == 128
    assert int8_tiles(4096, rows=16) == (32, 128, 4, 2) and int8_tiles(4096, rows=33) == (64, 128, 3, 4)


def test_k_slices_do_not_change_with_the_rows():
    """A split-K slice's bounds are whole multiples of a step that every tile's loop step divides: a row's partials,
    so its bits, are the same at any row count (a Gemma 3 1B down, 1152 × 6912 in 54 chunks and 8
    slices, had 7 slices at one row and 8 above 16 rows before)."""
    from kernels.quant_linear_triton import _slice_chunks, _slice_step, int4_slices, int4_tiles

    assert int4_slices(1152, 54, 8) == 7
    for n in (896, 1152, 4096, 6144, 28672, 128256):
        for chunks in range(1, 130):
            for splits in (2, 4, 8):
                cs = _slice_chunks(chunks, splits, _slice_step(n, chunks))
                for rows in (1, 16, 32, 48, 64):
                    step = int4_tiles(n, chunks, rows=rows)[1]
                    assert cs % step == 0 and chunks % step == 0, (n, chunks, splits, rows)


@needs_triton
@pytest.mark.parametrize("splits", [1, 2, 8])
def test_stacked_formats_write_one_result(splits):
    """int4 rows beside int8 rows (q/k and a Q6_K v): each format's kernel writes its columns of one result, in the
    same K slices, equal to the two products side by side; a row's bits do not depend on the row count. (Where the
    formats would cut K differently, as 8 splits do on the interpreter's tiles: one slice.)"""
    from engine.quant.stacked import StackedRows

    k = 256 if not ON_GPU else 1024
    words, pairs, _ = _int4(48, k)
    qk = QuantTensor("int4", (48, k), "Q4_0", words=words, pairs=pairs)
    codes = torch.randint(-127, 128, (20, k), generator=torch.Generator().manual_seed(2), dtype=torch.int8)
    v = QuantTensor("int8", (20, k), "Q8_0", codes=codes.to(DEVICE), scale=torch.full((20,), 0.01).bfloat16().to(DEVICE))
    st = StackedRows([qk, v])
    st.impl = "triton"
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    x = _x(MAX_M, k, dtype)
    want = torch.cat([int4_linear(x, words, pairs, out_dtype=torch.float32, impl="triton"),
                      int8_linear(x, v.codes, v.scale, out_dtype=torch.float32, impl="triton")], dim=1)
    got = st.partials(x, splits) if splits > 1 else st(x, torch.float32)[None]
    from engine.quant.stacked import _slices_of

    slices = {_slices_of(p, splits) for p in (qk, v)}
    assert got.shape == (slices.pop() if len(slices) == 1 else 1, MAX_M, 68)
    torch.testing.assert_close(got.sum(0), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    for m in (1, 3, 16):
        alone = st.partials(x[:m], splits) if splits > 1 else st(x[:m], torch.float32)[None]
        assert torch.equal(alone, got[:, :m]), m
    assert torch.equal(st.rows(torch.tensor([0, 47, 48, 67], device=DEVICE)),
                       torch.cat([qk.rows(torch.tensor([0, 47], device=DEVICE)),
                                  v.rows(torch.tensor([0, 19], device=DEVICE))]))


@pytest.mark.skipif(not ON_GPU, reason="the interpreter's tiles have one loop step at every row count")
def test_split_partials_of_a_row_do_not_depend_on_the_row_count():
    """Batched == alone for split-K partials where the one-row tile steps two chunks and the wider ones one: a Gemma 3
    1B down (1152 × 6912, 54 chunks) in 8 splits."""
    words, pairs, _ = _int4(1152, 6912)
    x = _x(MAX_M, 6912, torch.bfloat16)
    full = int4_partials(x, words, pairs, 8, impl="triton")
    for m in (1, 9, 16, 17, 33, 49):
        assert torch.equal(int4_partials(x[:m], words, pairs, 8, impl="triton"), full[:, :m]), m



def test_small_int8_matrices_prefetch_into_l2_and_large_ones_do_not():
    """With PDL, int8 codes of up to PREFETCH_BYTES stream into L2 while the previous kernel runs (H200: the 8B v
    13.0 → 8.6 µs); the 270M head (168 MB) lost 53 → 69 µs that way, so large ones never do."""
    from kernels.quant_linear_triton import PREFETCH_BYTES, _prefetches

    pdl, plain = {"PDL": True}, {"PDL": False}
    v = torch.empty(1024, 4096, dtype=torch.int8, device="meta")
    head = torch.empty(262144, 640, dtype=torch.int8, device="meta")
    assert v.numel() <= PREFETCH_BYTES < head.numel()
    assert _prefetches(pdl, 32, 4, None, v) and not _prefetches(plain, 32, 4, None, v)
    assert not _prefetches(pdl, 64, 4, None, head) and _prefetches(pdl, 64, 4, True, head)
    assert not _prefetches(pdl, 256, 4, None, v)  # fewer lanes than rows
    assert not _prefetches(pdl, 32, 4, None, torch.empty(64, 40, dtype=torch.int8, device="meta"))  # 40-byte rows


@needs_triton
def test_tiled_int4_layout_gives_the_row_major_bits():
    """Where N is whole tiles the CUDA layout keeps a chunk's 16 rows together (contiguous loads); the products,
    partials, dequantized matrix and looked-up rows are bit for bit the row-major layout's, and rows that are not
    whole tiles stay row-major."""
    from kernels.quant_linear import int4_gather_rows, int4_row_major, int4_tiled

    n, k = (1024, 1024) if ON_GPU else (32, 256)
    words, pairs, _ = _int4(n, k)
    assert words.shape == (n // 16, k // 128, 16, 16) and pairs.shape == (n // 16, k // 128, 16, 4)
    flat_w, flat_p = int4_row_major(words, pairs)
    assert flat_w.shape == (n, k // 8) and all(t.equal(u) for t, u in zip(int4_tiled(flat_w, flat_p, 16),
                                                                          (words, pairs)))
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    x = _x(MAX_M, k, dtype)
    for m in (1, MAX_M):
        assert torch.equal(int4_linear(x[:m], words, pairs, impl="triton"),
                           int4_linear(x[:m], flat_w, flat_p, impl="triton")), m
        assert torch.equal(int4_partials(x[:m], words, pairs, 4, impl="triton"),
                           int4_partials(x[:m], flat_w, flat_p, 4, impl="triton")), m
    assert torch.equal(int4_dequantize(words, pairs, dtype, k, impl="triton"),
                       int4_dequantize(flat_w, flat_p, dtype, k, impl="triton"))
    ids = torch.tensor([0, 17, n - 1, 5, 16], device=DEVICE)
    assert all(t.equal(u) for t, u in zip(int4_gather_rows(words, pairs, ids), (flat_w[ids], flat_p[ids])))
    assert _int4(20, 64)[0].dim() == 2


def test_fused_int4_parts_keep_their_rows_in_either_layout():
    """q/k/v or gate/up fuse into one matrix: tiled parts concatenate as tiles; a part that is not whole tiles makes
    the result row-major, or tiled again where the sum is; every row is the part's row."""
    from engine.quant.weight import concat_rows

    def part(n, seed):
        w, p, _ = _int4(n, 256, seed)
        return QuantTensor("int4", (n, 256), "Q4_0", words=w, pairs=p)

    for sizes in ((32, 16), (16, 8, 8), (16, 20), (8, 16)):
        parts = [part(n, i) for i, n in enumerate(sizes)]
        fused = concat_rows(parts)
        total = sum(sizes)
        assert fused.shape == (total, 256) and fused.words.dim() == (4 if total % 16 == 0 else 2), sizes
        want = torch.cat([p.rows(torch.arange(p.shape[0], device=DEVICE)) for p in parts])
        assert torch.equal(fused.rows(torch.arange(total, device=DEVICE)), want), sizes


def test_fp4_layout_holds_the_files_values():
    """MXFP4 in CUDA's fp4 words: every weight is the file's 4-bit float times its block's 2^(e - 127), exactly as the
    CPU's decoder reads it (exponents 0 and 128 included, K padded with zeros); a block above 2^1 is left to int8."""
    from engine.quant.block_codes import slice_codes
    from engine.quant.weight import choose_format, format_bytes, mxfp4_words

    n, k = 32, 96
    raw = _mxfp4_raw(n, k)
    q = mxfp4_words(raw, k)
    assert q.format == "fp4" and q.words.shape == (2, 1, 16, 16) and q.pairs.shape == (2, 1, 16, 1)
    codes = slice_codes(None, "MXFP4", raw, k)  # the CPU's: FP4_CODES (zero 12) times 2^(e - 128)
    want = torch.from_numpy(codes.codes.astype(np.float32) - 12) * torch.from_numpy(codes.scale).repeat_interleave(32, 1)
    assert torch.equal(q.dequantize(), want)
    assert torch.equal(int4_rows_reference(q.words, q.pairs, torch.float32), torch.cat([want, torch.zeros(n, 32)], 1))
    row_major = mxfp4_words(raw[:20], k)
    assert row_major.words.dim() == 2 and torch.equal(row_major.dequantize(), want[:20])
    assert choose_format("MXFP4", 2880, 2880, "cuda") == "fp4" and format_bytes("fp4", 64, 2880) == 64 * 2880 * 17 // 32
    high = raw.copy().reshape(n, -1, 17)
    high[3, 1, 0] = 129
    assert mxfp4_words(high.reshape(n, -1), k) is None


@needs_triton
@pytest.mark.parametrize("n,k", SHAPES)
def test_fp4_kernels_match_reference(n, k):
    """The decode GEMM, its split-K partials and the dequantizing kernel on fp4 words: the reference's values (the
    dequantized matrix bit for bit), a row's bits independent of the row count, tiles equal to row-major rows."""
    from kernels.quant_linear import int4_row_major

    words, pairs = _fp4(n, k)
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    ref_w = int4_rows_reference(words, pairs, dtype, k)
    assert torch.equal(int4_dequantize(words, pairs, dtype, k, impl="triton"), ref_w)
    x = _x(MAX_M, k, dtype)
    ref = x.double() @ ref_w.double().t()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-3
    got = int4_linear(x, words, pairs, out_dtype=torch.float32, impl="triton")
    assert (got.double() - ref).abs().max() <= tol * ref.abs().max()
    for m in (1, 5):
        assert torch.equal(int4_linear(x[:m], words, pairs, out_dtype=torch.float32, impl="triton"), got[:m]), m
    parts = int4_partials(x, words, pairs, 4, impl="triton")
    assert (parts.double().sum(0) - ref).abs().max() <= tol * ref.abs().max()
    if words.dim() == 4:
        flat_w, flat_p = int4_row_major(words, pairs)
        assert torch.equal(int4_linear(x[:1], flat_w, flat_p, impl="triton"), int4_linear(x[:1], words, pairs,
                                                                                          impl="triton"))
