"""GGUF quantized blocks read without building the fp32 tensor: the 4-bit types as codes with a scale and zero
per 32 weights, every other type dequantized a slice of rows at a time (bounded scratch)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 32  # weights per scale/zero in the int4 format
ROW_SLICE_BYTES = 32 << 20  # fp32 scratch of one dequantized slice of rows
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")
NATIVE = FOUR_BIT + ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")  # the types the common files hold
FLOAT = ("F32", "F16", "BF16")


@dataclass(slots=True)
class Int4Groups:
    """w = (codes - 8) * scale + zero, per group of 32 along a row; codes (N, K) uint8 in 0..15."""

    codes: np.ndarray
    scale: np.ndarray  # (N, K / 32) float32
    zero: np.ndarray  # (N, K / 32) float32


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., 16) bytes -> (..., 32) codes: ggml puts element j in the low nibble of byte j, j + 16 in its high one."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def int4_groups(type_name: str, blocks: np.ndarray, n: int, k: int) -> Int4Groups:
    """The codes, scales and zeros of a Q4_0, Q4_1 or Q4_K tensor of shape (n, k) stored as raw `blocks`."""
    raw = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(n, -1)
    if type_name == "Q4_0":
        b = raw.reshape(n, k // 32, 18)
        d = _f16(b[..., 0:2])
        return Int4Groups(_nibbles(b[..., 2:]).reshape(n, k), d, np.zeros_like(d))
    if type_name == "Q4_1":
        b = raw.reshape(n, k // 32, 20)
        d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        return Int4Groups(_nibbles(b[..., 4:]).reshape(n, k), d, m + 8 * d)
    if type_name == "Q4_K":
        return _q4_k(raw.reshape(n, k // 256, 144), n, k)
    raise ValueError(f"{type_name} is not a 4-bit type")


def _q4_k(b: np.ndarray, n: int, k: int) -> Int4Groups:
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])  # (n, S)
    sc, mn = _k_scale_min(b[..., 4:16])  # (n, S, 8) each
    qs = b[..., 16:].reshape(n, -1, 4, 32)  # four chunks of 64 weights: low nibbles then high nibbles
    codes = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, k)
    scale = (d[..., None] * sc).reshape(n, -1)
    zero = 8 * scale - (dmin[..., None] * mn).reshape(n, -1)
    return Int4Groups(codes, scale, zero)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit (scale, min) pairs packed into a K-quant super-block's 12 bytes."""
    s = s.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), dtype=np.float32)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def dequantized_rows(type_id, blocks: np.ndarray, n: int, k: int):
    """Yields (row start, fp32 rows) slices of a tensor of any type gguf can read, never the whole tensor."""
    raw = np.asarray(blocks)
    raw = raw.reshape(n, -1) if raw.size else raw
    per_slice = max(1, ROW_SLICE_BYTES // (4 * k))
    for start in range(0, n, per_slice):
        yield start, to_float32(type_id, raw[start:start + per_slice]).reshape(-1, k)


def to_float32(type_id, raw: np.ndarray) -> np.ndarray:
    """Raw GGUF data of any type gguf can read (floats as stored, quantized as block bytes) as a new fp32 array."""
    import gguf

    if type_id == gguf.GGMLQuantizationType.F32:
        return np.array(raw, dtype=np.float32)  # a copy: the file's mapping is read-only
    if type_id == gguf.GGMLQuantizationType.F16:
        return np.asarray(raw).view(np.float16).astype(np.float32)
    if type_id == gguf.GGMLQuantizationType.BF16:
        return (np.asarray(raw).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return _dequantized_in_slices(type_id, raw)


def _dequantized_in_slices(type_id, raw: np.ndarray) -> np.ndarray:
    """A quantized tensor decoded a slice of rows at a time into one array: gguf's numpy decoding holds about three
    fp32 copies of what it decodes at once (the embedded model's 262,144-row Q8_0 embedding: 2 GB on top of its
    0.67 GB), which the memory estimate does not count; under a limit it failed, or numpy crashed with SIGSEGV."""
    import gguf

    if raw.ndim < 2 or len(raw) < 2:
        return gguf.quants.dequantize(np.ascontiguousarray(raw), type_id)
    first = gguf.quants.dequantize(np.ascontiguousarray(raw[:1]), type_id)  # a row's width once decoded
    per_slice = max(1, ROW_SLICE_BYTES // first[0].nbytes)
    out = np.empty((len(raw), *first.shape[1:]), dtype=np.float32)
    for start in range(0, len(raw), per_slice):
        rows = np.ascontiguousarray(raw[start:start + per_slice])
        out[start:start + per_slice] = gguf.quants.dequantize(rows, type_id)
    return out
