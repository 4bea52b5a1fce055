"""GGUF blocks as the CPU kernels' codes. Q4_K, Q5_K and Q6_K rows whose length is a whole number of super-blocks keep
the file's bytes, codes reordered (kernels/cpu/kgemm.c); every other type becomes unsigned codes u with, per group of 16
or 32 weights, a scale s and offset o, w = s·u + o (kernels/cpu/qgemm.c; byte codes with zero 128 reordered in units
for kernels/cpu/q8gemm.c). The common types map exactly (up to the fp16 rounding of s and o), and MXFP4 (gpt-oss's
experts) as 4-bit indices into FP4_CODES; any other type is re-quantized from its dequantized rows to symmetric int8
groups of 32."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.quant.gguf_blocks import ROW_SLICE_BYTES, _f16, _k_scale_min, _nibbles, to_float32
from kernels.kquant_layout import natural_codes

EXACT = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "MXFP4")
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")
SUPER = ("Q4_K", "Q5_K", "Q6_K")  # kept as super-blocks (codes interleaved for kgemm.c) where K allows
# (bytes per block, weights per block)
BLOCK = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q4_K": (144, 256), "Q5_0": (22, 32), "Q5_1": (24, 32),
         "Q5_K": (176, 256), "Q6_K": (210, 256), "Q8_0": (34, 32), "MXFP4": (17, 32)}
# MXFP4's 16 4-bit floats (e2m1: ±0, 0.5, 1, 1.5, 2, 3, 4, 6) doubled and moved by 12: codes 0..24 with zero 12, so
# w = s·(code - 12) with s = 2^(e - 128) for the block's exponent e (its own scale is 2^(e - 127))
FP4_CODES = np.array([12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0], dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class CodeLayout:
    """How a matrix's codes read: `bits` 4 (two codes a byte), 5 (`pack_fives`; Q5_0 in units: `codes_layout`) or 8;
    `group` weights per scale; symmetric formats (`zero` >= 0) keep no offsets, o = -zero·s."""

    bits: int
    group: int
    zero: int  # -1: offsets stored
    raw: str = ""  # a type name: that type's super-blocks, codes interleaved (kernels/kquant_layout.py; kgemm.c's)
    units: bool = False  # byte codes interleaved in units of 256 (kernels/kquant_layout.py; q8gemm.c's)
    lut: bool = False  # 4-bit indices into FP4_CODES (MXFP4): held as indices, the kernel looks the codes up
    tiles: bool = False  # in groups of 16 columns for AMX: signed byte codes (kernels/kquant_layout.tile_codes), or
    # with `raw`, Q4_K/Q5_K super-blocks (kernels/kquant_layout.tile_superblocks)


TILED = CodeLayout(8, 32, 128, tiles=True)  # byte codes with zero 128 on a CPU with AMX tiles (kernels/cpu/amxgemm.c)
TILED_FIFTHS = CodeLayout(5, 32, 128, tiles=True)  # Q5_0's there, in 5 bits


def held_layout(type_name: str, k: int) -> CodeLayout:
    """How the CPU kernels hold an (n, k) matrix of `type_name`: its own super-blocks (codes interleaved:
    kernels/kquant_layout.py) where there is a kernel for them and K is whole super-blocks, else `codes_layout`."""
    lay = layout(type_name)
    if type_name in SUPER and k % BLOCK[type_name][1] == 0:
        return CodeLayout(lay.bits, lay.group, lay.zero, type_name)
    return codes_layout(type_name, k)


def codes_layout(type_name: str, k: int) -> CodeLayout:
    """`layout`'s codes for an (n, k) matrix, interleaved in units where they are bytes with zero 128 and K is whole
    units of 128 (kernels/cpu/q8gemm.c); Q5_0's in 5 bits there (its file's size, not 8 bits a weight)."""
    lay = layout(type_name)
    if lay != CodeLayout(8, 32, 128) or k % 128:
        return lay
    return CodeLayout(5 if type_name == "Q5_0" else 8, 32, 128, units=True)


def tiled_layout(lay: CodeLayout, n: int) -> CodeLayout:
    """How an (n, k) matrix that `codes_layout` holds as byte codes with zero 128 in groups of 32 (in units for
    q8gemm.c, or blocks for qgemm.c where K is not whole units) is held where AMX tiles run
    (kernels/cpu_native.amx_ready) and n is whole groups of 16 columns: in the tiles' groups, in 8 bits, or 5 as in
    units; else `lay` itself."""
    if (not lay.units and lay != CodeLayout(8, 32, 128)) or n % 16:
        return lay
    from kernels.cpu_native import amx_ready

    return (TILED if lay.bits == 8 else TILED_FIFTHS) if amx_ready() else lay


def tiled_superblocks(type_name: str, n: int) -> bool:
    """Whether an (n, k) matrix held as `type_name` super-blocks (`held_layout`) goes to the AMX tiles' groups of 16
    columns (kernels/cpu/amxkgemm.c): Q4_K or Q5_K, n whole groups, and the tiles run here."""
    from kernels.kquant_layout import TILED_TYPES

    if type_name not in TILED_TYPES or n % 16:
        return False
    from kernels.cpu_native import amx_ready

    return amx_ready()


def layout(type_name: str) -> CodeLayout:
    if type_name in ("Q4_1", "Q4_K"):
        return CodeLayout(4, 32, -1)
    if type_name == "Q4_0":
        return CodeLayout(4, 32, 8)
    if type_name in ("Q5_1", "Q5_K"):
        return CodeLayout(5, 32, -1)
    if type_name == "Q6_K":
        return CodeLayout(8, 16, 32)
    if type_name == "MXFP4":
        return CodeLayout(4, 32, 12, lut=True)
    return CodeLayout(8, 32, 128)  # Q8_0, and every re-quantized type


@dataclass(slots=True)
class Codes:
    """A slice of rows: codes (n, k) uint8 (unpacked), scales and offsets (n, k / group) fp32 (offsets None when
    symmetric)."""

    codes: np.ndarray
    scale: np.ndarray
    offset: np.ndarray | None


def row_slices(type_id, type_name: str, blocks: np.ndarray, n: int, k: int):
    """Yields (row start, Codes) for the rows of a tensor of any type gguf reads, a bounded slice at a time."""
    raw = np.asarray(blocks)
    raw = raw.reshape(n, -1) if raw.size else raw
    per_slice = max(1, ROW_SLICE_BYTES // (4 * k))
    for start in range(0, n, per_slice):
        rows = np.ascontiguousarray(raw[start:start + per_slice], dtype=np.uint8) if type_name in EXACT \
            else raw[start:start + per_slice]
        yield start, slice_codes(type_id, type_name, rows, k)


def slice_codes(type_id, type_name: str, raw: np.ndarray, k: int) -> Codes:
    n = raw.shape[0]
    if type_name not in EXACT:
        return requantize(to_float32(type_id, raw).reshape(n, k))
    size, per = BLOCK[type_name]
    b = raw.reshape(n, k // per, size)
    return _DECODERS[type_name](b, n, k)


def requantize(w: np.ndarray) -> Codes:
    """fp32 rows -> symmetric int8 groups of 32 (u = q + 128) with the scale rounded up to fp16 first."""
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    s = (np.abs(g).max(-1) / 127 * (1 + 2 ** -10)).astype(np.float16).astype(np.float32)
    safe = np.where(s > 0, s, 1)
    q = np.clip(np.rint(g / safe[..., None]), -127, 127)
    return Codes((q + 128).astype(np.uint8).reshape(n, k), s, None)


def _q4_0(b, n, k):
    return Codes(_nibbles(b[..., 2:]).reshape(n, k), _f16(b[..., 0:2]), None)


def _q4_1(b, n, k):
    return Codes(_nibbles(b[..., 4:]).reshape(n, k), _f16(b[..., 0:2]), _f16(b[..., 2:4]))


def _q4_k(b, n, k):
    return _k_with_mins(b, n, k, "Q4_K")


def _k_with_mins(b, n, k, type_name: str) -> Codes:
    """Q4_K/Q5_K: fp16 d and dmin, then the 6-bit (scale, min) pairs of the eight sub-blocks, then the codes."""
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scale_min(b[..., 4:16])
    codes = natural_codes(b, type_name).reshape(n, k)
    return Codes(codes, (d[..., None] * sc).reshape(n, -1), -(dmin[..., None] * mn).reshape(n, -1))


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 32 high bits (4 bytes, little-endian) as (..., 32) values 0 or 16."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")
    return bits * np.uint8(16)


def _q5_0(b, n, k):
    codes = (_nibbles(b[..., 6:]) | _fifth_bits(b[..., 2:6])) + np.uint8(112)  # zero 128, as Q8_0: q/k/v fuse
    return Codes(codes.reshape(n, k), _f16(b[..., 0:2]), None)


def _q5_1(b, n, k):
    codes = _nibbles(b[..., 8:]) | _fifth_bits(b[..., 4:8])
    return Codes(codes.reshape(n, k), _f16(b[..., 0:2]), _f16(b[..., 2:4]))


def _q5_k(b, n, k):
    return _k_with_mins(b, n, k, "Q5_K")


def _q6_k(b, n, k):
    sc = b[..., 192:208].view(np.int8).astype(np.float32)  # (n, S, 16), one per 16 weights in order
    d = _f16(b[..., 208:210])
    return Codes(natural_codes(b, "Q6_K").reshape(n, k), (d[..., None] * sc).reshape(n, -1), None)


def _q8_0(b, n, k):
    u = b[..., 2:] ^ np.uint8(0x80)  # int8 q + 128, in one byte operation
    return Codes(u.reshape(n, k), _f16(b[..., 0:2]), None)


def fp4_scales(exponents: np.ndarray) -> np.ndarray:
    """MXFP4 blocks' exponent bytes e as the scales of FP4_CODES: 2^(e - 128), fp32."""
    return np.ldexp(np.float32(1.0), exponents.astype(np.int32) - 128).astype(np.float32)


def _mxfp4(b, n, k):
    """A block: its exponent byte e, then 16 bytes of 4-bit floats (element j low in byte j, j + 16 high)."""
    return Codes(FP4_CODES[_nibbles(b[..., 1:])].reshape(n, k), fp4_scales(b[..., 0]), None)


_DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q5_K": _q5_k,
             "Q6_K": _q6_k, "Q8_0": _q8_0, "MXFP4": _mxfp4}


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """(n, k) codes 0..15 -> (n, k / 2) bytes: per block of 32, byte j = code j | code j + 16 << 4."""
    n, k = codes.shape
    c = codes.reshape(n, k // 32, 2, 16)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).astype(np.uint8).reshape(n, k // 2)


def pack_fives(codes: np.ndarray) -> np.ndarray:
    """(n, k) codes 0..31 -> (n, 5k / 8) bytes: per block of 32, the low 4 bits as `pack_nibbles` (16 bytes), then
    4 bytes whose bit j is code j's fifth bit, as GGUF's Q5 blocks hold them."""
    n, k = codes.shape
    c = codes.reshape(n, k // 32, 32).astype(np.uint8)
    low = pack_nibbles((c & 0x0F).reshape(n, k)).reshape(n, k // 32, 16)
    return np.concatenate([low, np.packbits(c >> 4, axis=-1, bitorder="little")], axis=-1).reshape(n, k // 8 * 5)


def superblock_codes(raw: np.ndarray, type_name: str) -> Codes:
    """Rows of `type_name` super-blocks as the file stores them (n, K/256 · bytes) as codes with exact fp32 scales
    d·sc and offsets."""
    size, per = BLOCK[type_name]
    n, k = raw.shape[0], raw.shape[1] // size * per
    return _DECODERS[type_name](np.ascontiguousarray(raw).reshape(n, k // per, size), n, k)


def superblock_rows(raw: np.ndarray, type_name: str, dtype=np.float32) -> np.ndarray:
    """(n, k) weights of rows of `type_name` super-blocks (file order), as the file defines them: (d·sc)·u + o with
    d·sc and o exact, one rounding to `dtype`."""
    c = superblock_codes(raw, type_name)
    lay = layout(type_name)
    s = np.repeat(c.scale.astype(dtype), lay.group, axis=1)
    o = -lay.zero * s if c.offset is None else np.repeat(c.offset.astype(dtype), lay.group, axis=1)
    return c.codes.astype(dtype) * s + o


def dequantize(c: Codes, lay: CodeLayout) -> np.ndarray:
    """fp32 rows of `c` (tests, lookups): s·u + o."""
    n, k = c.codes.shape
    s = np.repeat(c.scale.astype(np.float16).astype(np.float32), lay.group, axis=1)
    o = -lay.zero * s if c.offset is None else np.repeat(c.offset.astype(np.float16).astype(np.float32),
                                                          lay.group, axis=1)
    return c.codes.astype(np.float32) * s + o
