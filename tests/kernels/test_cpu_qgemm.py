"""Parley's CPU kernels over block codes (kernels/cpu/qgemm.c, and q8gemm.c for byte codes interleaved in units):
GGUF blocks decoded exactly, the kernels against their float64 reference on every layout and row count, rows
independent of their batch (batched == alone, bit for bit), and every instruction-set path this CPU can run (the AVX2
fallback included)."""
from __future__ import annotations


import gguf
import numpy as np
import pytest
import torch

from engine.quant.block_codes import (BLOCK, CodeLayout, layout, pack_fives, pack_nibbles, requantize, row_slices,
                                      slice_codes)
from engine.quant.weight import FP4_LUT
from kernels import cpu_native
from kernels.cpu_native import cpu_kernel
from kernels.cpu_qgemm import q8gemm, qgemm, qgemm_reference
from kernels.kquant_layout import interleave_units, natural_units, pack_fifths, unpack_fifths

needs_kernel = pytest.mark.skipif(cpu_kernel() is None, reason="the CPU kernel does not build here")


def _random_blocks(name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random block bytes with sane fp16 scales (random bits there would be inf/NaN)."""
    size, per = BLOCK[name]
    b = rng.integers(0, 256, (n, k // per, size), dtype=np.uint8)
    if name == "MXFP4":  # a power-of-two exponent byte: weights of 2^-18 .. 2^7 (what fp16 scales hold)
        b[..., 0] = rng.integers(110, 135, b.shape[:2])
        return b.reshape(n, -1)
    fields = {"Q4_0": [0], "Q5_0": [0], "Q8_0": [0], "Q4_1": [0, 2], "Q5_1": [0, 2], "Q4_K": [0, 2],
              "Q5_K": [0, 2], "Q6_K": [208]}[name]
    for off in fields:
        half = rng.uniform(1e-3, 5e-2, b.shape[:2]).astype(np.float16)
        b[..., off:off + 2] = half.view(np.uint8).reshape(*b.shape[:2], 2)
    return b.reshape(n, -1)


def _dequantized(codes, lay: CodeLayout) -> np.ndarray:
    s = np.repeat(codes.scale, lay.group, 1)
    o = -lay.zero * s if codes.offset is None else np.repeat(codes.offset, lay.group, 1)
    return codes.codes.astype(np.float32) * s + o


@pytest.mark.parametrize("name", sorted(BLOCK))
def test_gguf_blocks_decode_exactly(name):
    raw = _random_blocks(name, 6, 512, np.random.default_rng(1))
    got = slice_codes(gguf.GGMLQuantizationType[name], name, raw, 512)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(6, 512)
    lay = layout(name)
    assert got.codes.max() < (25 if lay.lut else 16 if lay.bits == 4 else 256)
    np.testing.assert_array_equal(_dequantized(got, lay), ref)


def test_mxfp4_files_bytes_are_held_as_they_are():
    """MXFP4 rows straight from the file (its nibbles the kernel's indices, -0 included; exponents as fp16 scales):
    the same weights as gguf decodes, and the kernel's product the reference's."""
    from engine.quant.weight import mxfp4_blocks

    raw = _random_blocks("MXFP4", 40, 256, np.random.default_rng(5))
    held = mxfp4_blocks(raw, 256)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4).reshape(40, 256)
    np.testing.assert_array_equal(held.dequantize().numpy(), ref)
    assert held.codes.shape == (40, 128) and held.code_layout.lut


def test_other_types_requantize_within_half_a_step():
    w = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    c = requantize(w)
    err = np.abs(_dequantized(c, layout("IQ4_NL")) - w)
    assert (err <= np.repeat(c.scale, 32, 1) / 2 + 1e-7).all()


def _weights(lay: CodeLayout, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    top = {4: 15, 5: 31}.get(lay.bits, 255 if lay.zero == 128 else 63)
    u = torch.randint(0, top + 1, (n, k), dtype=torch.uint8, generator=g)
    pack = {4: pack_nibbles, 5: pack_fives}.get(lay.bits)
    codes = torch.from_numpy(pack(u.numpy())) if pack else u
    scales = (torch.rand(n, k // lay.group, generator=g) * 0.02 + 1e-3).half()
    offsets = (torch.randn(n, k // lay.group, generator=g) * 0.05).half() if lay.zero < 0 else None
    return codes, scales, offsets


LAYOUTS = [CodeLayout(8, 32, 128), CodeLayout(4, 32, 8), CodeLayout(4, 32, -1), CodeLayout(8, 16, 32),
           CodeLayout(8, 32, -1), CodeLayout(5, 32, -1), CodeLayout(4, 32, 12, lut=True)]  # the last: MXFP4


def _check_against_reference(run, lay: CodeLayout, k: int, weights=None) -> None:
    codes, scales, offsets = (weights or _weights)(lay, 70, k, seed=k)
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(7)) * 3
    x[3, 5] = 80.0  # an outlier: its block's other values lose precision, as in llama.cpp
    x[4] = 0.0  # an all-zero row
    ref = qgemm_reference(x, codes, scales, offsets, lay.bits, lay.group, max(lay.zero, 0), _lut(lay))
    for rows in (1, 3, 4, 8, 11):  # every tile remainder
        got = run(x[:rows], codes, scales, offsets, lay)
        torch.testing.assert_close(got, ref[:rows], atol=1e-4, rtol=1e-5)
    together = run(x, codes, scales, offsets, lay)
    alone = torch.cat([run(x[i:i + 1], codes, scales, offsets, lay) for i in range(len(x))])
    assert torch.equal(together, alone)  # a row's sum never depends on the rows beside it


def _lut(lay: CodeLayout) -> torch.Tensor | None:
    return FP4_LUT if lay.lut else None


@needs_kernel
@pytest.mark.parametrize("k", [640, 96])  # an even and an odd number of 32-blocks
@pytest.mark.parametrize("lay", LAYOUTS, ids=str)
def test_kernel_matches_reference_and_rows_are_independent(lay, k):
    def run(x, codes, scales, offsets, lay):
        return qgemm(x, codes, scales, offsets, lay.bits, lay.group, max(lay.zero, 0), lut=_lut(lay), impl="native")

    _check_against_reference(run, lay, k)


@needs_kernel
def test_bias_is_added_as_torch_adds_it():
    lay = LAYOUTS[0]
    codes, scales, offsets = _weights(lay, 40, 96, seed=4)
    x, bias = torch.randn(3, 96), torch.randn(40)
    plain = qgemm(x, codes, scales, offsets, lay.bits, lay.group, max(lay.zero, 0), impl="native")
    got = qgemm(x, codes, scales, offsets, lay.bits, lay.group, max(lay.zero, 0), bias, impl="native")
    assert torch.equal(got, plain + bias)


# The AVX2 fallback (a CPU without VNNI), the AVX-512 tile and the 256-bit VNNI tile (an AVX-VNNI CPU's)
ISA_PATHS = pytest.mark.parametrize("march, extra, isa", [("x86-64-v3", (), "avx2"), ("icelake-server", (), "avx512-vnni"),
                                                          ("icelake-server", ("-DPARLEY_YMM",), "avx512-vnni")],
                                    ids=["avx2", "avx512", "vnni-256"])


@needs_kernel
@ISA_PATHS
@pytest.mark.parametrize("lay", LAYOUTS, ids=str)
def test_each_instruction_set_path(build_for, lay, march, extra, isa):
    """The AVX2 fallback (a CPU without VNNI), the AVX-512 tile and the 256-bit VNNI tile (an AVX-VNNI CPU's),
    where this CPU can run them."""
    flags = open("/proc/cpuinfo").read()
    if isa == "avx512-vnni" and "avx512_vnni" not in flags:
        pytest.skip("this CPU has no AVX-512 VNNI")
    lib = build_for(march, extra).lib
    assert lib.parley_qgemm_isa().decode() == isa

    def run(x, codes, scales, offsets, lay):
        x = x.contiguous()
        y = torch.empty(x.shape[0], codes.shape[0])
        rc = lib.parley_qgemm(x.data_ptr(), x.shape[0], x.shape[1], codes.data_ptr(), scales.data_ptr(),
                              offsets.data_ptr() if offsets is not None else None, lay.bits,
                              FP4_LUT.data_ptr() if lay.lut else None, lay.group, max(lay.zero, 0), codes.shape[0],
                              None, y.data_ptr(), 2)
        assert rc == 0
        return y

    _check_against_reference(run, lay, 640)


def test_reference_runs_without_the_kernel(monkeypatch):
    lay = CodeLayout(4, 32, -1)
    codes, scales, offsets = _weights(lay, 8, 64, seed=3)
    x = torch.randn(2, 64)
    monkeypatch.setattr(cpu_native, "cpu_kernel", lambda: None)
    y = qgemm(x, codes, scales, offsets, 4, 32, 0)
    torch.testing.assert_close(y, qgemm_reference(x, codes, scales, offsets, 4, 32, 0))
    with pytest.raises(RuntimeError, match="not available"):
        qgemm(x, codes, scales, offsets, 4, 32, 0, impl="native")


def test_kernel_off_by_environment(monkeypatch):
    monkeypatch.setenv(cpu_native.DISABLE_ENV, "0")
    assert cpu_native._load.__wrapped__() == (None, None)  # the process's own library is left alone


def test_missing_compiler_is_a_notice_and_torch_kernels_serve(monkeypatch, tiny_models_q8):
    """No C compiler on an x86-64 machine: the model loads on torch's formats with one line saying why."""
    from engine.loading.loader import LoadOptions, load_model
    from engine.quant import weight

    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(cpu_native.shutil, "which", lambda name: None)
    monkeypatch.setattr(cpu_native.platform, "machine", lambda: "x86_64")
    kernel, reason = cpu_native._load.__wrapped__()  # what a machine without a compiler finds
    assert kernel is None and "no C compiler" in reason
    monkeypatch.setattr(weight, "blocks_available", lambda: False)
    monkeypatch.setattr(cpu_native, "missing_reason", lambda: reason)
    lm = load_model(tiny_models_q8["llama"].gguf_path, LoadOptions(weights="quantized"))
    assert "blocks" not in lm.quantization()
    assert any("CPU kernels are not available" in n and "no C compiler" in n for n in lm.notices), lm.notices


# -- byte codes interleaved in units (kernels/cpu/q8gemm.c)
BYTES = CodeLayout(8, 32, 128)


FIFTHS = CodeLayout(5, 32, 128, units=True)  # Q5_0's codes u = q + 112, held in 5 bits


def _unit_run(lib=None, bits: int = 8):
    """The units kernel as _check_against_reference calls a kernel: the codes go in interleaved (and, 5 bits,
    packed)."""
    def run(x, codes, scales, offsets, lay):
        held = interleave_units(codes.numpy())
        held = torch.from_numpy(pack_fifths(held) if bits == 5 else held)
        if lib is None:
            return q8gemm(x, held, scales, bits=bits, impl="native")
        x = x.contiguous()
        y = torch.empty(x.shape[0], codes.shape[0])
        assert lib.parley_q8gemm(x.data_ptr(), x.shape[0], x.shape[1], held.data_ptr(), scales.data_ptr(), bits,
                                 codes.shape[0], None, y.data_ptr(), 2) == 0
        return y

    return run


def _fifths(lay, n, k, seed):
    """Q5_0-shaped weights: codes 112..143 (q + 112), an fp16 scale per 32."""
    _, scales, offsets = _weights(BYTES, n, k, seed)
    return torch.from_numpy(np.random.default_rng(seed).integers(112, 144, (n, k), dtype=np.uint8)), scales, offsets


@pytest.mark.parametrize("k", [128, 640, 768])  # a lone 128, units and a last 128, whole units
def test_units_round_trip_and_put_each_group_in_its_lane(k):
    codes = np.random.default_rng(k).integers(0, 256, (3, k), dtype=np.uint8)
    held = interleave_units(codes)
    np.testing.assert_array_equal(natural_units(held), codes)
    width = 256 if k >= 256 else 128
    g, c, t = 5, 1, 3  # weight (W/16)·g + 4c + t sits at 64c + 4g + t
    assert held[1, 64 * c + 4 * g + t] == codes[1, width // 16 * g + 4 * c + t]


@pytest.mark.parametrize("k", [128, 640, 768])
def test_fifths_round_trip_and_byte_layout(k):
    codes = np.random.default_rng(k).integers(112, 144, (3, k), dtype=np.uint8)
    packed = pack_fifths(codes)
    assert packed.shape == (3, k // 8 * 5)
    np.testing.assert_array_equal(unpack_fifths(packed), codes)
    q = codes[2, 64:128].astype(int) - 112  # the second chunk: 40 bytes from 40
    assert packed[2, 40 + 7] == (q[7] & 15) | ((q[39] & 15) << 4)
    assert (packed[2, 40 + 32 + 5] >> 3) & 1 == q[43] >> 4  # position 43's fifth bit: byte 5, bit 3
    with pytest.raises(ValueError, match="5 bits"):
        pack_fifths(np.full((1, 64), 144, dtype=np.uint8))


@needs_kernel
@pytest.mark.parametrize("bits", [8, 5])
@pytest.mark.parametrize("k", [128, 640, 768])
def test_units_kernel_matches_reference_and_rows_are_independent(k, bits):
    _check_against_reference(_unit_run(bits=bits), BYTES, k, weights=_fifths if bits == 5 else _weights)


@needs_kernel
@pytest.mark.parametrize("bits", [8, 5])
def test_units_kernel_columns_are_independent(bits):
    """Columns go through the kernel two at a time (and an odd last one alone): each column's bits are those of the
    column multiplied by itself."""
    n, k = 7, 640
    codes, scales, _ = (_fifths if bits == 5 else _weights)(BYTES, n, k, 3)
    held = interleave_units(codes.numpy())
    held = torch.from_numpy(pack_fifths(held) if bits == 5 else held)
    for rows in (1, 8, 13):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        y = q8gemm(x, held, scales, bits=bits, impl="native")
        for j in range(n):
            alone = q8gemm(x, held[j:j + 1].contiguous(), scales[j:j + 1].contiguous(), bits=bits, impl="native")
            assert torch.equal(y[:, j:j + 1], alone), (rows, j)


@needs_kernel
@ISA_PATHS
def test_units_kernel_on_each_instruction_set_path(build_for, march, extra, isa):
    if isa == "avx512-vnni" and "avx512_vnni" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU has no AVX-512 VNNI")
    lib = build_for(march, extra).lib
    _check_against_reference(_unit_run(lib), BYTES, 640)
    _check_against_reference(_unit_run(lib, bits=5), BYTES, 640, weights=_fifths)
    for bits in (8, 5):  # columns two at a time at few rows: each column's bits as alone
        codes, scales, _ = (_fifths if bits == 5 else _weights)(BYTES, 7, 640, 3)
        run = _unit_run(lib, bits)
        for rows in (1, 2, 9):
            x = torch.randn(rows, 640, generator=torch.Generator().manual_seed(rows))
            y = run(x, codes, scales, None, BYTES)
            assert all(torch.equal(y[:, j:j + 1], run(x, codes[j:j + 1].contiguous(), scales[j:j + 1].contiguous(),
                                                        None, BYTES)) for j in range(7)), (bits, rows)


@needs_kernel
def test_units_kernel_bias_and_refusals():
    codes, scales, _ = _weights(BYTES, 40, 256, seed=5)
    held = torch.from_numpy(interleave_units(codes.numpy()))
    x, bias = torch.randn(11, 256), torch.randn(40)  # runs of columns past a tile
    assert torch.equal(q8gemm(x, held, scales, bias, impl="native"), q8gemm(x, held, scales, impl="native") + bias)
    with pytest.raises(ValueError, match="does not take K = 96"):
        q8gemm(torch.randn(1, 96), held[:, :96].contiguous(), scales[:, :3].contiguous(), impl="native")


def test_units_reference_runs_without_the_kernel(monkeypatch):
    codes, scales, _ = _weights(BYTES, 8, 128, seed=6)
    held = torch.from_numpy(interleave_units(codes.numpy()))
    x = torch.randn(2, 128)
    monkeypatch.setattr(cpu_native, "cpu_kernel", lambda: None)
    torch.testing.assert_close(q8gemm(x, held, scales), qgemm_reference(x, codes, scales, None, 8, 32, 128))


def _matrix(name: str, n: int, k: int, seed: int):
    """An (n, k) matrix of random `name` blocks as the loader builds it, and its exact float values."""
    from engine.quant.weight import BlockRows

    raw = _random_blocks(name, n, k, np.random.default_rng(seed))
    rows = BlockRows(n, k, name)
    for start, codes in row_slices(gguf.GGMLQuantizationType[name], name, raw, n, k):
        rows.put(start, codes)
    return rows.done(), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(n, k)


@needs_kernel
def test_q5_0_is_held_in_5_bits_and_fuses_with_q8_0():
    from engine.quant.weight import concat_rows

    q5, w5 = _matrix("Q5_0", 24, 640, seed=8)
    q8, w8 = _matrix("Q8_0", 8, 640, seed=9)
    assert q5.code_layout == FIFTHS and q5.nbytes() == 24 * 640 * 5 // 8 + 24 * 20 * 2  # codes + fp16 scales
    np.testing.assert_array_equal(q5.dequantize().numpy(), w5)  # rows unpack exactly
    x = torch.randn(3, 640)
    codes, bits = q5.natural_codes()
    assert bits == 8
    torch.testing.assert_close(q5(x), qgemm_reference(x, codes, q5.scales, None, 8, 32, 128), atol=1e-4, rtol=1e-5)
    fused = concat_rows([q5, q8])  # a Q8_0 v beside Q5_0 q and k: one byte-code matrix
    assert fused.code_layout == CodeLayout(8, 32, 128, units=True)
    assert torch.equal(fused(x), torch.cat([q5(x), q8(x)], dim=1))  # 5 bits and bytes: the same products, bit for bit
    np.testing.assert_array_equal(fused.dequantize().numpy(), np.concatenate([w5, w8]))



def test_five_bit_blocks_round_trip():
    """Q5_1/Q5_K codes in 5 bits a weight: GGUF's Q5 block order, and back."""
    from kernels.cpu_qgemm import unpack_codes

    codes = np.random.default_rng(5).integers(0, 32, (3, 96), dtype=np.uint8)
    packed = pack_fives(codes)
    assert packed.shape == (3, 60)
    assert packed[1, 20 + 3] == (codes[1, 32 + 3] & 15) | ((codes[1, 32 + 19] & 15) << 4)  # block 1, byte 3
    assert (packed[1, 20 + 16 + 2] >> 5) & 1 == codes[1, 32 + 21] >> 4  # block 1: code 21's fifth bit, byte 2 bit 5
    np.testing.assert_array_equal(unpack_codes(torch.from_numpy(packed), 5, 96).numpy(), codes)


@needs_kernel
@pytest.mark.parametrize("name", ["Q5_1", "Q5_K"])
def test_five_bit_types_are_held_in_5_bits(name):
    q, w = _matrix(name, 16, 512, seed=10)
    assert q.code_layout == CodeLayout(5, 32, -1) and q.nbytes() == 16 * 512 * 5 // 8 + 16 * 16 * 4
    codes, bits = q.natural_codes()
    raw = _random_blocks(name, 16, 512, np.random.default_rng(10))  # the same blocks _matrix read
    np.testing.assert_array_equal(codes.numpy(), slice_codes(gguf.GGMLQuantizationType[name], name, raw, 512).codes)
    np.testing.assert_allclose(q.dequantize().numpy(), w, atol=1e-3 * np.abs(w).max())  # s and o held in fp16
    x = torch.randn(3, 512)
    ref = qgemm_reference(x, codes, q.scales, q.offsets, bits, 32, 0)
    torch.testing.assert_close(q(x), ref, atol=1e-4, rtol=1e-5)
