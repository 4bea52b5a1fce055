"""A weight matrix kept quantized in its runtime's format: the module that multiplies by it and looks rows up.

Formats (chosen per tensor by `choose_format`, measured in docs/QUANTIZED.md):
  int4  4-bit codes in groups of 32 with a bf16 scale and zero: Q4_0, Q4_1, Q4_K exactly. On the CPU in torch's
        int4pack layout (`packed`, `scale_zero`); on CUDA as int32 words of eight codes with bf16 (scale, zero)
        pairs (`words`, `pairs`) for the Triton kernels of kernels/quant_linear_triton.py
  fp4   CUDA only: MXFP4 (gpt-oss's experts) in int4's words, each nibble a 4-bit float, with one exponent byte per
        group of 32 (`pairs`, one int32 per chunk of 128): the file's values exactly, 4.25 bits a weight
  int8  int8 codes with one bf16 scale per row (torch's int8pack; the same on CUDA): every other quantized type,
        re-quantized
  bf16  F16/BF16 tensors, and shapes the packed kernels do not take
  blocks  the CPU's own kernels, where they build: Q4_K/Q5_K/Q6_K as the file's super-blocks, codes interleaved
        (kernels/cpu/kgemm.c, buffer `blocks`); every other type as unsigned codes (4-bit packed or one byte) with an
        fp16 scale (and offset) per group of 16 or 32, w = s·u + o (kernels/cpu/qgemm.c), byte codes with zero 128
        interleaved in units (kernels/cpu/q8gemm.c): every GGUF quantization exactly, as llama.cpp multiplies it
        (engine/quant/block_codes.py, kernels/kquant_layout.py); preferred to int4/int8 on the CPU wherever it is there
On the CPU products take fp32 or bf16 activations and return fp32 (the kernels run on bf16 activations); on CUDA
they return the activations' dtype (or `out_dtype`).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from engine.quant.block_codes import (BLOCK, FP4_CODES, TILED, TILED_FIFTHS, CodeLayout, codes_layout, fp4_scales,
                                      held_layout, superblock_rows, tiled_layout, tiled_superblocks)
from engine.quant.gguf_blocks import FLOAT, FOUR_BIT, GROUP, Int4Groups
from kernels.quant_linear import WORDS

FP4_LUT = torch.from_numpy(FP4_CODES)  # MXFP4's codes by index (engine/quant/block_codes.py)

FORMATS = ("int4", "fp4", "int8", "bf16", "blocks")
CHUNK = 128  # weights per chunk of the CUDA int4 layout
TILE_ROWS = 16  # CUDA int4 rows whose chunks lie side by side (kernels/quant_linear_triton.py: contiguous loads)


class WeightMatrix(nn.Module):
    """A weight module of `shape` (N, K): N outputs, K inputs."""

    shape: tuple[int, int]

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]


class QuantTensor(WeightMatrix):
    """An (N, K) weight in one of FORMATS; `forward(x)` = x @ Wᵀ in fp32, `rows(ids)` = W[ids] in fp32."""

    def __init__(self, fmt: str, shape: tuple[int, int], source_type: str, code_layout: CodeLayout | None = None,
                 **tensors: torch.Tensor):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, not {fmt!r}")
        if (fmt == "blocks") != (code_layout is not None):
            raise ValueError("the blocks format, and only it, takes a code layout")
        self.format, self.shape, self.source_type = fmt, tuple(shape), source_type
        self.code_layout = code_layout
        for name, t in tensors.items():
            self.register_buffer(name, t)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None,
                bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """x @ Wᵀ; `bias` (N,) fp32, the blocks format only, is added inside the product's call. `out` (R, N) fp32:
        where the CPU library's products write (a buffer kept across calls); other formats make their own."""
        if bias is not None and (self.format != "blocks" or x.is_cuda):
            raise ValueError("only the CPU's blocks product takes a bias")
        if x.is_cuda:
            return self._cuda_product(x, out_dtype or x.dtype)
        if self.format == "blocks" and self.code_layout.raw:
            from kernels.cpu_kgemm import amxkgemm, kgemm

            product = amxkgemm if self.code_layout.tiles else kgemm
            y = product(x.reshape(-1, x.shape[-1]), self.blocks, self.code_layout.raw, bias, impl="native", out=out)
            return y.to(out_dtype or torch.float32).reshape(*x.shape[:-1], self.shape[0])
        if self.format == "blocks" and self.code_layout.tiles:
            from kernels.cpu_qgemm import amxgemm

            y = amxgemm(x.reshape(-1, x.shape[-1]), self.codes, self.scales, bias, bits=self.code_layout.bits,
                        impl="native", out=out)
            return y.to(out_dtype or torch.float32).reshape(*x.shape[:-1], self.shape[0])
        if self.format == "blocks" and self.code_layout.units:
            from kernels.cpu_qgemm import q8gemm

            y = q8gemm(x.reshape(-1, x.shape[-1]), self.codes, self.scales, bias, bits=self.code_layout.bits,
                       impl="native", out=out)
            return y.to(out_dtype or torch.float32).reshape(*x.shape[:-1], self.shape[0])
        if self.format == "blocks":
            from kernels.cpu_qgemm import qgemm

            lay = self.code_layout
            # native: a blocks matrix exists only where the library built; never the float64 reference at run time
            y = qgemm(x.reshape(-1, x.shape[-1]), self.codes, self.scales, getattr(self, "offsets", None), lay.bits,
                      lay.group, max(lay.zero, 0), bias, lut=FP4_LUT if lay.lut else None, impl="native", out=out)
            return y.to(out_dtype or torch.float32).reshape(*x.shape[:-1], self.shape[0])
        lead, xb = x.shape[:-1], x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if self.format == "int4":
            y = torch._weight_int4pack_mm_for_cpu(xb, self.packed, GROUP, self.scale_zero)
        elif self.format == "int8":
            y = torch._weight_int8pack_mm(xb, self.codes, self.scale)
        else:
            y = torch.mm(xb, self.weight.t())
        return y.to(out_dtype or torch.float32).reshape(*lead, self.shape[0])

    def _cuda_product(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        from kernels.quant_linear import int4_linear, int8_linear

        lead, x2 = x.shape[:-1], x.reshape(-1, x.shape[-1])
        if self.format in WORDS:
            y = int4_linear(x2, self.words, self.pairs, out_dtype=out_dtype)
        elif self.format == "int8":
            y = int8_linear(x2, self.codes, self.scale, out_dtype=out_dtype)
        else:
            y = torch.nn.functional.linear(x2, self.weight.to(x2.dtype)).to(out_dtype)
        return y.reshape(*lead, self.shape[0])

    def partials(self, x: torch.Tensor, splits: int) -> torch.Tensor:
        """x (T, K) @ Wᵀ as split-K fp32 partials (S, T, N) for a consumer that sums them (CUDA int4 and int8 decode
        steps), else the product itself (T, N)."""
        if x.is_cuda and self.format in WORDS and splits > 1:
            from kernels.quant_linear import int4_partials

            return int4_partials(x, self.words, self.pairs, splits)
        if x.is_cuda and self.format == "int8" and splits > 1:
            from kernels.quant_linear import int8_partials

            return int8_partials(x, self.codes, self.scale, splits)
        return self(x)

    def decode_splits(self) -> int:
        """How many K slices this matrix's decode GEMM takes when its consumer sums partials (CUDA int4, int8)."""
        if self.format == "int8" and self.codes.is_cuda:
            from kernels.quant_linear_triton import int8_splits

            return int8_splits(*self.shape, self.codes.device)
        if self.format not in WORDS or not hasattr(self, "words"):
            return 0
        from kernels.quant_linear_triton import int4_splits

        return int4_splits(self.shape[0], self.pairs.shape[1], self.words.device)  # pairs: (rows or tiles, chunks, ...)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows `ids` dequantized (an embedding lookup reads only these)."""
        if self.format == "int8":
            return self.codes[ids].float() * self.scale[ids].float()[:, None]
        if self.format == "bf16":
            return self.weight[ids].float()
        if self.format == "blocks":
            return self._block_rows(ids.reshape(-1))
        if hasattr(self, "words"):
            from kernels.quant_linear import int4_gather_rows, int4_rows_reference

            return int4_rows_reference(*int4_gather_rows(self.words, self.pairs, ids.reshape(-1)), torch.float32,
                                       self.shape[1])
        return _int4_rows(self.packed, self.scale_zero, ids, self.shape[1])

    def _block_rows(self, ids: torch.Tensor) -> torch.Tensor:
        from kernels.cpu_qgemm import unpack_codes

        lay = self.code_layout
        if lay.raw:
            return torch.from_numpy(superblock_rows(self.file_blocks(ids), lay.raw))
        codes, bits = self.natural_codes(ids)
        u = unpack_codes(codes, bits, self.shape[1]).float()
        s = self.natural_scales(ids).float().repeat_interleave(lay.group, dim=1)
        o = -lay.zero * s if lay.zero >= 0 else self.offsets[ids].float().repeat_interleave(lay.group, dim=1)
        return u * s + o

    def file_blocks(self, ids: torch.Tensor | None = None) -> np.ndarray:
        """A super-blocks matrix's rows `ids` (default all) as the file stores them (n, K/256 · bytes)."""
        from kernels.kquant_layout import file_order, untile_superblocks

        lay = self.code_layout
        if lay.tiles:
            return _tiled_rows(self.blocks, ids, lambda held: untile_superblocks(held, lay.raw)).numpy()
        return file_order((self.blocks if ids is None else self.blocks[ids]).numpy(), lay.raw)

    def natural_codes(self, ids: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """The blocks format's codes (of rows `ids`, default all) in weight order and their bits (4 or 8): the units'
        interleaving and the 5-bit packings (Q5_0 in units, Q5_1/Q5_K in blocks) undone."""
        lay = self.code_layout
        if lay.tiles:
            from kernels.kquant_layout import untile_codes

            return _tiled_rows(self.codes, ids, lambda held: untile_codes(held, lay.bits)), 8
        codes = self.codes if ids is None else self.codes[ids]
        if lay.lut:
            from kernels.cpu_qgemm import unpack_codes

            return FP4_LUT[unpack_codes(codes, 4, self.shape[1]).long()], 8
        if not lay.units:
            if lay.bits == 5:
                from kernels.cpu_qgemm import unpack_codes

                return unpack_codes(codes, 5, self.shape[1]), 8
            return codes, lay.bits
        from kernels.kquant_layout import natural_units, unpack_fifths

        held = unpack_fifths(codes.numpy()) if lay.bits == 5 else codes.numpy()
        return torch.from_numpy(natural_units(held)), 8

    def natural_scales(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """The blocks format's scales (of rows `ids`, default all), row by row (the AMX tiles' grouping undone)."""
        if self.code_layout.tiles:
            from kernels.kquant_layout import untile_scales

            return _tiled_rows(self.scales, ids, untile_scales)
        return self.scales if ids is None else self.scales[ids]

    def dequantize(self) -> torch.Tensor:
        return self.rows(torch.arange(self.shape[0], device=next(self.buffers()).device))


def _tiled_rows(held: torch.Tensor, ids: torch.Tensor | None, untile) -> torch.Tensor:
    """Rows `ids` (default all) of a matrix held in groups of 16 rows (the AMX tiles' layout), in row order: only the
    groups that hold them are undone (an embedding lookup reads a few rows of 262,144)."""
    if ids is None:
        return torch.from_numpy(untile(held.numpy()))
    ids = ids.reshape(-1).long()
    groups, inverse = torch.unique(ids // 16, return_inverse=True)
    per = held.shape[0] // 16
    rows = held.reshape(per, -1)[groups].reshape(len(groups) * 16, held.shape[1])
    natural = torch.from_numpy(untile(rows.numpy()))
    return natural.reshape(len(groups), 16, natural.shape[1])[inverse, ids % 16]


def concat_rows(parts: list[QuantTensor]) -> QuantTensor | None:
    """One matrix holding the parts' rows in order (fused q/k/v or gate/up: one kernel call), or None when their
    formats differ. Rows are independent in every format (int4 packs whole blocks of rows), so nothing changes."""
    fmt, k = parts[0].format, parts[0].shape[1]
    if any(p.format != fmt or p.shape[1] != k for p in parts):
        return None
    n = sum(p.shape[0] for p in parts)
    source = "+".join(dict.fromkeys(p.source_type for p in parts))
    if fmt == "blocks":
        parts = _common_units(parts)
        if any(p.code_layout != parts[0].code_layout for p in parts):
            return None
        names = [name for name, _ in parts[0].named_buffers()]
        return QuantTensor(fmt, (n, k), source, parts[0].code_layout,
                           **{name: torch.cat([getattr(p, name) for p in parts]) for name in names})
    if fmt in WORDS and hasattr(parts[0], "words"):
        return _concat_words(parts, source)
    if fmt == "int4":
        return QuantTensor(fmt, (n, k), source, packed=torch.cat([p.packed for p in parts]),
                           scale_zero=torch.cat([p.scale_zero for p in parts], dim=1))
    if fmt == "int8":
        return QuantTensor(fmt, (n, k), source, codes=torch.cat([p.codes for p in parts]),
                           scale=torch.cat([p.scale for p in parts]))
    return QuantTensor(fmt, (n, k), source, weight=torch.cat([p.weight for p in parts]))


def _concat_words(parts: list[QuantTensor], source: str) -> QuantTensor:
    """CUDA int4 (or fp4) parts as one matrix: tiles concatenate as they are; a part of rows that are not whole tiles
    makes the whole row-major (then tiled again where the sum is whole tiles)."""
    from kernels.quant_linear import int4_row_major

    n, k, fmt = sum(p.shape[0] for p in parts), parts[0].shape[1], parts[0].format
    if all(p.words.dim() == 4 for p in parts):
        return QuantTensor(fmt, (n, k), source, words=torch.cat([p.words for p in parts]),
                           pairs=torch.cat([p.pairs for p in parts]))
    rows = [int4_row_major(p.words, p.pairs) for p in parts]
    return _words_tensor(fmt, (n, k), source, torch.cat([w for w, _ in rows]), torch.cat([q for _, q in rows]))


def _words_tensor(fmt: str, shape: tuple[int, int], source: str, words: torch.Tensor,
                  pairs: torch.Tensor) -> QuantTensor:
    """A CUDA int4/fp4 matrix from row-major words and pairs, tiled where its rows are whole tiles."""
    if shape[0] % TILE_ROWS == 0:
        from kernels.quant_linear import int4_tiled

        words, pairs = int4_tiled(words, pairs, TILE_ROWS)
    return QuantTensor(fmt, shape, source, words=words, pairs=pairs)


def _common_units(parts: list[QuantTensor]) -> list[QuantTensor]:
    """Parts of byte codes with zero 128 in different holdings (a Q8_0 v beside Q5_0 q and k: 8 and 5 bits, in units
    or in the AMX tiles' groups): all as bytes, in the tiles' groups where every part is there, else in units, so that
    they fuse."""
    lays = {p.code_layout for p in parts}
    if len(lays) < 2 or not lays <= {FIFTH_UNITS, BYTE_UNITS, TILED_FIFTHS, TILED}:
        return parts
    tiled = lays <= {TILED_FIFTHS, TILED}
    return [_as_bytes(p, tiled) for p in parts]


FIFTH_UNITS, BYTE_UNITS = CodeLayout(5, 32, 128, units=True), CodeLayout(8, 32, 128, units=True)


def _as_bytes(p: QuantTensor, tiled: bool) -> QuantTensor:
    """A matrix of byte codes with zero 128 in units (q8gemm.c's) or, `tiled`, in the AMX tiles' groups, in 8 bits."""
    from kernels.kquant_layout import interleave_units

    target = TILED if tiled else BYTE_UNITS
    if p.code_layout == target:
        return p
    natural, scales = p.natural_codes()[0], p.natural_scales().clone()  # a units part's scales are its own tensor
    if tiled:
        codes = torch.empty_like(natural)
        _tile_groups(natural, scales, codes, 8)
    else:
        codes = torch.from_numpy(interleave_units(natural.numpy()))
    return QuantTensor("blocks", p.shape, p.source_type, target, codes=codes, scales=scales)


def pack_int4(groups: Int4Groups, source_type: str, device: str = "cpu") -> QuantTensor:
    n, k = groups.codes.shape
    if device.startswith("cuda"):
        return _pack_int4_words(groups, source_type)
    codes = torch.from_numpy(groups.codes.astype(np.int32))
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    sz = np.stack([groups.scale, groups.zero], -1).transpose(1, 0, 2)  # (K/32, N, 2), the kernel's order
    return QuantTensor("int4", (n, k), source_type, packed=packed,
                       scale_zero=torch.from_numpy(np.ascontiguousarray(sz)).to(torch.bfloat16))


def _pack_int4_words(groups: Int4Groups, source_type: str) -> QuantTensor:
    """The CUDA layout (kernels/quant_linear_triton.py): K padded to chunks of 128 weights (code 8, scale and zero 0:
    weight 0); in a chunk, nibble i of word w is weight 16 i + w; per chunk four int32 of bf16 pairs (s0|s2, s1|s3,
    z0|z2, z1|z3); tiles of TILE_ROWS rows where N is whole tiles."""
    n, k = groups.codes.shape
    kp = -(-k // CHUNK) * CHUNK
    chunks = kp // CHUNK
    words = _nibble_words(groups.codes)
    sz = np.zeros((2, n, kp // GROUP), dtype=np.float32)
    sz[0, :, :k // GROUP], sz[1, :, :k // GROUP] = groups.scale, groups.zero
    bits = torch.from_numpy(sz).bfloat16().view(torch.int16).int() & 0xFFFF  # (2, N, KP/32)
    g = bits.reshape(2, n, chunks, 4)
    pairs = torch.stack([g[0, ..., 0] | g[0, ..., 2] << 16, g[0, ..., 1] | g[0, ..., 3] << 16,
                         g[1, ..., 0] | g[1, ..., 2] << 16, g[1, ..., 1] | g[1, ..., 3] << 16], dim=-1)
    return _words_tensor("int4", (n, k), source_type, words, pairs.to(torch.int32).contiguous())


def _nibble_words(codes: np.ndarray) -> torch.Tensor:
    """(N, K) codes 0..15 -> the CUDA words (N, KP/8) int32: K padded to chunks of 128 with code 8 (weight 0 where
    scale and zero are 0); in a chunk, nibble i of word w is code 16 i + w."""
    n, k = codes.shape
    chunks = -(-k // CHUNK)
    padded = np.full((n, chunks * CHUNK), 8, dtype=np.uint32)
    padded[:, :k] = codes
    c = padded.reshape(n, chunks, 8, 16)
    words = np.zeros((n, chunks, 16), dtype=np.uint32)
    for i in range(8):
        words |= c[:, :, i] << np.uint32(4 * i)
    return torch.from_numpy(words.view(np.int32).reshape(n, -1))


FP4_MAX_EXPONENT = 128  # fp4 scales 2^(e - 127) reach the kernels as bf16 2^(e - 1): e <= 128


def mxfp4_words(raw: np.ndarray, k: int, row_order: torch.Tensor | None = None) -> QuantTensor | None:
    """An (N, K) MXFP4 matrix in CUDA's fp4 format from the file's (N, K/32 · 17) bytes (each block: its exponent
    byte, then element j low in byte j, j + 16 high), or None where an exponent is above FP4_MAX_EXPONENT (weights of
    2^2 and up: int8 rows hold those)."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // 32, 17)
    if n and blocks[..., 0].max() > FP4_MAX_EXPONENT:
        return None
    chunks = -(-k // CHUNK)
    padded = np.zeros((n, chunks * 4, 17), dtype=np.uint8)  # padding groups: code 0 (+0), exponent 127
    padded[:, :k // 32] = blocks
    padded[:, k // 32:, 0] = 127
    # word w of a chunk holds weights w, 16 + w, ..., 112 + w: nibbles 2b and 2b + 1 are the low and high halves of
    # byte w of the chunk's block b, so each word is byte w of its four blocks, a byte transpose of the file's
    quads = padded[..., 1:].reshape(n, chunks, 4, 16).transpose(0, 1, 3, 2)
    words = torch.from_numpy(np.ascontiguousarray(quads).view(np.int32).reshape(n, chunks * 16))
    pairs = torch.from_numpy(np.ascontiguousarray(padded[..., 0]).view(np.int32).reshape(n, chunks, 1))
    if row_order is not None:
        words, pairs = words[row_order], pairs[row_order]
    return _words_tensor("fp4", (n, k), "MXFP4", words, pairs)


def choose_format(type_name: str, n: int, k: int, device: str = "cpu") -> str:
    """The format of an (n, k) matrix stored as `type_name` (not F32, which stays exact) on `device`'s kernels."""
    if device.startswith("cuda"):  # the Triton kernels take any N and mask K; int4 needs whole groups
        if type_name == "MXFP4" and k % GROUP == 0:
            return "fp4"
        return "int4" if type_name in FOUR_BIT and k % GROUP == 0 else "bf16" if type_name in FLOAT else "int8"
    if type_name not in FLOAT and k % GROUP == 0 and blocks_available():
        return "blocks"
    if type_name in FOUR_BIT and int4_fits(n, k):
        return "int4"
    if type_name in FLOAT or not int8_fits(k):
        return "bf16"
    return "int8"


def format_bytes(fmt: str, n: int, k: int, type_name: str = "Q8_0") -> int:
    if fmt == "blocks":
        lay = held_layout(type_name, k)
        if lay.raw:
            size, per = BLOCK[lay.raw]
            return n * (k // per) * size
        per_group = 2 if lay.zero >= 0 else 4  # fp16 scale (and offset)
        return n * k * lay.bits // 8 + n * (k // lay.group) * per_group
    if fmt == "int4":
        return n * k // 2 + n * k // 8  # codes + a bf16 scale and zero per 32 (CUDA pads K to 128: at most 80 B/row)
    if fmt == "fp4":
        return n * k // 2 + n * k // 32  # codes + an exponent byte per 32
    if fmt == "int8":
        return n * k + 2 * n  # codes + a bf16 scale per row
    return 2 * n * k


def quantize_bytes(scheme: str, n: int, k: int) -> int:
    """Resident bytes of an (n, k) float matrix quantized at load with `scheme` ("q8" / "q4", from_float.py)."""
    if k % GROUP == 0 and blocks_available():
        return format_bytes("blocks", n, k, "Q8_0" if scheme == "q8" else "Q4_1")
    return format_bytes("int8" if scheme == "q8" else "int4", n, k)


def blocks_available() -> bool:
    """Whether the CPU's own kernel built here (kernels/cpu_native.py)."""
    from kernels.cpu_native import cpu_kernel

    return cpu_kernel() is not None


def superblocks(raw: np.ndarray, type_name: str, row_order: torch.Tensor | None = None,
                tiles: bool = True) -> QuantTensor:
    """An (N, K) Q4_K/Q5_K/Q6_K matrix held as its rows' super-blocks, from `raw` (N, K/256 · bytes) uint8 as the file
    stores them, a bounded slice of rows at a time; the codes interleaved for kgemm.c, every other byte as is, or,
    `tiles` allowing, in the AMX tiles' groups where they run (`tiled_superblocks`)."""
    from kernels.cpu_kgemm import interleave

    size, per = BLOCK[type_name]
    n, k = raw.shape[0], raw.shape[1] // size * per
    if tiles and tiled_superblocks(type_name, n):
        return _tiled_superblocks(raw if row_order is None else raw[row_order.numpy()], type_name, k)
    held = torch.empty(n, raw.shape[1], dtype=torch.uint8)
    step = max(1, (32 << 20) // max(1, raw.shape[1]))  # a bounded slice of the file's pages at a time
    for start in range(0, n, step):
        held[start:start + step] = interleave(raw[start:start + step], type_name)
    if row_order is not None:
        held = held[row_order]
    return QuantTensor("blocks", (n, k), type_name, held_layout(type_name, k), blocks=held)


def _tiled_superblocks(raw: np.ndarray, type_name: str, k: int) -> QuantTensor:
    """`superblocks` in the AMX tiles' groups (kernels/kquant_layout.tile_superblocks), a bounded slice of whole
    groups at a time."""
    from kernels.cpu_kgemm import tile

    n = raw.shape[0]
    held = torch.empty(raw.shape, dtype=torch.uint8)
    step = max(16, (32 << 20) // max(1, raw.shape[1]) // 16 * 16)
    for start in range(0, n, step):
        held[start:start + step] = tile(raw[start:start + step], type_name)
    return QuantTensor("blocks", (n, k), type_name, replace(held_layout(type_name, k), tiles=True), blocks=held)


class BlockRows:
    """Fills an (N, K) blocks-format weight a slice of rows (engine/quant/block_codes.Codes) at a time."""

    def __init__(self, n: int, k: int, type_name: str):
        self.type_name, self.layout = type_name, codes_layout(type_name, k)
        self.layout = tiled_layout(self.layout, n)  # grouped at `done`: rows come in slices, not whole groups
        lay = self.layout
        if lay.lut:  # its codes are indices, held as the file has them
            raise ValueError("MXFP4 rows are held from the file's bytes (mxfp4_blocks), not through BlockRows")
        self.codes = torch.empty(n, k * lay.bits // 8, dtype=torch.uint8)
        self.scales = torch.empty(n, k // lay.group, dtype=torch.float16)
        self.offsets = torch.empty(n, k // lay.group, dtype=torch.float16) if lay.zero < 0 else None
        # the tiles' groups: bytes in weight order until `done` (5 bits: one matrix's bytes for a moment)
        self.natural = (self.codes if lay.bits == 8 else torch.empty(n, k, dtype=torch.uint8)) if lay.tiles else None

    def put(self, start: int, c) -> None:
        from engine.quant.block_codes import pack_fives, pack_nibbles

        stop = start + len(c.codes)
        if self.natural is not None:
            self.natural[start:stop] = torch.from_numpy(np.ascontiguousarray(c.codes))
            self.scales[start:stop] = torch.from_numpy(c.scale).half()
            return
        codes = pack_nibbles(c.codes) if self.layout.bits == 4 else c.codes
        codes = pack_fives(codes) if self.layout.bits == 5 and not self.layout.units else codes
        if self.layout.units:  # rows are independent: each slice is interleaved as it comes (no second copy)
            from kernels.kquant_layout import interleave_units, pack_fifths

            codes = interleave_units(codes)
            codes = pack_fifths(codes) if self.layout.bits == 5 else codes
        self.codes[start:stop] = torch.from_numpy(np.ascontiguousarray(codes))
        self.scales[start:stop] = torch.from_numpy(c.scale).half()
        if self.offsets is not None:
            self.offsets[start:stop] = torch.from_numpy(c.offset).half()

    def done(self, row_order: torch.Tensor | None = None) -> QuantTensor:
        if self.natural is not None:
            natural, scales = (self.natural, self.scales) if row_order is None else \
                (self.natural[row_order], self.scales[row_order])
            _tile_groups(natural, scales, self.codes, self.layout.bits)
            self.natural = None
            return QuantTensor("blocks", tuple(natural.shape), self.type_name, self.layout, codes=self.codes,
                               scales=scales)
        tensors = {"codes": self.codes, "scales": self.scales}
        if self.offsets is not None:
            tensors["offsets"] = self.offsets
        if row_order is not None:
            tensors = {name: t[row_order] for name, t in tensors.items()}
        return QuantTensor("blocks", (self.codes.shape[0], self.scales.shape[1] * self.layout.group),
                           self.type_name, self.layout, **tensors)


def _tile_groups(natural: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, bits: int) -> None:
    """Byte codes (zero 128) in weight order into `out` as the AMX tiles' groups in `bits` (out may be natural
    itself), the scales grouped in place; a bounded slice of whole groups at a time."""
    from kernels.kquant_layout import tile_codes, tile_scales

    step = max(16, (32 << 20) // max(1, natural.shape[1]) // 16 * 16)
    for start in range(0, natural.shape[0], step):
        out[start:start + step] = torch.from_numpy(tile_codes(natural[start:start + step].numpy(), bits))
        scales[start:start + step] = torch.from_numpy(tile_scales(scales[start:start + step].numpy()))


def mxfp4_blocks(raw: np.ndarray, k: int, row_order: torch.Tensor | None = None) -> QuantTensor:
    """An (N, K) MXFP4 matrix in the blocks format straight from the file's (N, K/32 · 17) bytes: its nibbles are the
    kernel's indices already (element j low in byte j, j + 16 high, as pack_nibbles lays codes out), its exponent
    bytes become fp16 scales; a bounded slice of rows at a time."""
    n = raw.shape[0]
    lay = codes_layout("MXFP4", k)
    codes = torch.empty(n, k // 2, dtype=torch.uint8)
    scales = torch.empty(n, k // 32, dtype=torch.float16)
    step = max(1, (32 << 20) // max(1, raw.shape[1]))
    for start in range(0, n, step):
        b = np.ascontiguousarray(raw[start:start + step], dtype=np.uint8).reshape(-1, k // 32, 17)
        codes[start:start + len(b)] = torch.from_numpy(np.ascontiguousarray(b[..., 1:]).reshape(len(b), -1))
        scales[start:start + len(b)] = torch.from_numpy(fp4_scales(b[..., 0]).astype(np.float16))
    if row_order is not None:
        codes, scales = codes[row_order], scales[row_order]
    return QuantTensor("blocks", (n, k), "MXFP4", lay, codes=codes, scales=scales)


def int4_fits(n: int, k: int) -> bool:
    """Whole packing blocks only: rows of a partial last block are laid out differently (and models' N are 64·m)."""
    block = _int4_block()
    return block is not None and n % block == 0 and k % GROUP == 0


def int8_fits(k: int) -> bool:
    return k % 32 == 0  # torch's int8pack kernel reads K in 32-wide vectors (other K: NaN or a crash)


class Int8Rows:
    """Fills an (N, K) int8-per-row weight a slice of fp32 rows at a time."""

    def __init__(self, n: int, k: int):
        self.codes = torch.empty(n, k, dtype=torch.int8)
        self.scale = torch.empty(n, dtype=torch.float32)

    def put(self, start: int, rows: np.ndarray) -> None:
        r = torch.from_numpy(rows)
        # the kernel reads a bf16 scale: round it up first, then the codes against it (error ≤ half a step)
        s = (r.abs().amax(1).clamp_min(1e-30) / 127 * (1 + 2 ** -8)).bfloat16().float()
        self.codes[start:start + len(r)] = (r / s[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        self.scale[start:start + len(r)] = s

    def done(self, source_type: str) -> QuantTensor:
        return QuantTensor("int8", tuple(self.codes.shape), source_type, codes=self.codes,
                           scale=self.scale.to(torch.bfloat16))


def bf16_tensor(weight: torch.Tensor, source_type: str) -> QuantTensor:
    return QuantTensor("bf16", tuple(weight.shape), source_type, weight=weight.to(torch.bfloat16).contiguous())


@lru_cache(maxsize=1)
def _int4_block() -> int | None:
    """Rows per block of torch's CPU int4 packing on this machine (it follows the ISA), found by packing a probe:
    within a block of B rows, byte (k, j) holds row j's code in its low nibble and row j + B/2's in its high one."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=g)
    try:
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    except (AttributeError, RuntimeError, NotImplementedError):  # an older torch: int8 rows serve instead
        return None
    for block in (64, 32, 16):
        half = block // 2
        b = q.reshape(128 // block, 2, half, 64)  # (blocks, lo/hi, row in half, k)
        expect = (b[:, 0] | (b[:, 1] << 4)).permute(0, 2, 1).to(torch.uint8).reshape(128, 32)
        if torch.equal(packed.reshape(128, 32), expect):
            return block
    return None


def _int4_rows(packed: torch.Tensor, scale_zero: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    block = _int4_block()
    half = block // 2
    view = packed.reshape(-1, k, half)  # (blocks, k, row in half)
    ids = ids.reshape(-1).long()
    byte = view[ids // block, :, ids % half]  # (T, k)
    codes = (byte >> (4 * ((ids % block) // half))[:, None].to(torch.uint8)) & 0x0F
    sz = scale_zero[:, ids].float()  # (K/32, T, 2)
    scale = sz[..., 0].t().repeat_interleave(GROUP, 1)
    zero = sz[..., 1].t().repeat_interleave(GROUP, 1)
    return (codes.float() - 8) * scale + zero


def weights_summary(model: nn.Module) -> str:
    """How a model's matrices are held, e.g. "Q4_K→int4 ×27, Q8_0→int8 ×10", or its float dtype."""
    counts: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, QuantTensor):
            key = f"{m.source_type}→{m.format}"
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        p = next(model.parameters(), None)
        return str(p.dtype).removeprefix("torch.") if p is not None else "?"
    return ", ".join(f"{k} ×{n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
