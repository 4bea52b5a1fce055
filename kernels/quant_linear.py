"""Weight-only quantized products and lookups on the GPU layouts of kernels/quant_linear_triton.py, with the
implementation switch of the attention ops (`impl="reference"` is plain PyTorch, `"triton"` the kernels).

Decode steps (at most 64 rows) multiply in the Triton kernels, which dequantize in registers; longer steps
(prefill) dequantize the matrix once per step to the activations' dtype and use the dense GEMM.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import _use_triton

MAX_ROWS = 64
GROUP = 32
WORDS = ("int4", "fp4")  # the formats held in int4's words and pairs (fp4: MXFP4, its pairs one int32 of exponents)
FP4_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])  # E2M1, by nibble


def is_fp4(pairs: torch.Tensor) -> bool:
    """Whether int4 words hold MXFP4's 4-bit floats: their pairs are one int32 of exponent bytes per chunk."""
    return pairs.shape[-1] == 1


def int4_tiled(words: torch.Tensor, pairs: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major int4 words (N, KP/8) and pairs (N, KP/128, W) in the tiled layout of kernels/quant_linear_triton.py:
    (N/tile, KP/128, tile, 16) and (N/tile, KP/128, tile, W); N a multiple of `tile`."""
    n, chunks, width = pairs.shape
    assert n % tile == 0, (n, tile)
    return (words.reshape(n // tile, tile, chunks, 16).transpose(1, 2).contiguous(),
            pairs.reshape(n // tile, tile, chunks, width).transpose(1, 2).contiguous())


def int4_row_major(words: torch.Tensor, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Either int4 layout as row-major words (N, KP/8) and pairs (N, KP/128, W) (a copy where tiled)."""
    if words.dim() == 2:
        return words, pairs
    g, chunks, tile, _ = words.shape
    return (words.transpose(1, 2).reshape(g * tile, chunks * 16),
            pairs.transpose(1, 2).reshape(g * tile, chunks, pairs.shape[-1]))


def int4_gather_rows(words: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `ids` (1-D) of either int4 layout, row-major: an embedding lookup's (T, KP/8) words, (T, KP/128, W) pairs."""
    if words.dim() == 2:
        return words[ids], pairs[ids]
    tile = words.shape[2]
    return words[ids // tile, :, ids % tile].flatten(1), pairs[ids // tile, :, ids % tile]


def int4_rows_reference(words: torch.Tensor, pairs: torch.Tensor, dtype: torch.dtype,
                       k: int | None = None) -> torch.Tensor:
    """Rows of either int4 layout (row-major: (T, KP/8) words, (T, KP/128, W) pairs) -> (T, k) in `dtype` (k: the
    unpadded width, default KP): (code - 8) * scale + zero in fp32, or for fp4 (W = 1) fp4 * 2^(e - 127)."""
    words, pairs = int4_row_major(words, pairs)
    t, chunks = words.shape[0], words.shape[1] // 16
    w = words.reshape(t, chunks, 1, 16)
    codes = (w >> (4 * torch.arange(8, device=words.device, dtype=words.dtype))[:, None]) & 0xF  # (T, C, 8, 16)
    if is_fp4(pairs):
        e = pairs.reshape(t, chunks, 1) >> (8 * torch.arange(4, device=words.device, dtype=pairs.dtype)) & 0xFF
        scale = torch.ldexp(torch.ones(e.shape, device=words.device), e - 127).repeat_interleave(GROUP, dim=-1)
        rows = FP4_VALUES.to(words.device)[codes.reshape(t, chunks, 128).long()] * scale
        return rows.reshape(t, chunks * 128)[:, :k].to(dtype)
    p = pairs.reshape(t, chunks, 4)
    def halves(a, b):  # the four groups' values (T, C, 4) of two bf16 pairs
        return torch.stack([_low(a), _low(b), _high(a), _high(b)], dim=-1)
    scale = halves(p[..., 0], p[..., 1]).repeat_interleave(GROUP, dim=-1)  # (T, C, 128)
    zero = halves(p[..., 2], p[..., 3]).repeat_interleave(GROUP, dim=-1)
    rows = (codes.reshape(t, chunks, 128).float() - 8) * scale + zero
    return rows.reshape(t, chunks * 128)[:, :k].to(dtype)


def _low(pair: torch.Tensor) -> torch.Tensor:
    return (pair << 16).view(torch.float32)


def _high(pair: torch.Tensor) -> torch.Tensor:
    return (pair & -65536).view(torch.float32)


def int4_dequantize(words: torch.Tensor, pairs: torch.Tensor, dtype: torch.dtype, k: int | None = None, *,
                    impl: str = "auto") -> torch.Tensor:
    if _use_triton(impl, words):
        from kernels.quant_linear_triton import int4_dequantize_triton

        return int4_dequantize_triton(words, pairs, dtype, k)
    return int4_rows_reference(words, pairs, dtype, k)


def int4_linear(x: torch.Tensor, words: torch.Tensor, pairs: torch.Tensor, *,
                out_dtype: torch.dtype | None = None, impl: str = "auto") -> torch.Tensor:
    """x (M, K) @ Wᵀ -> (M, N) in `out_dtype` (default x's) for an int4 matrix; products in fp32."""
    out_dtype = out_dtype or x.dtype
    if _use_triton(impl, x) and x.shape[0] <= MAX_ROWS:
        from kernels.quant_linear_triton import int4_linear_triton

        return int4_linear_triton(_unit_stride(x), words, pairs, out_dtype=out_dtype)
    w = int4_dequantize(words, pairs, x.dtype, x.shape[1], impl=impl)
    return _dense(x, w, out_dtype)


def int4_partials(x: torch.Tensor, words: torch.Tensor, pairs: torch.Tensor, splits: int, *,
                  impl: str = "auto") -> torch.Tensor:
    """x @ Wᵀ as split-K fp32 partials (S, M, N), S <= `splits`, for a consumer that sums them (add_norm); the
    reference and longer steps give one fp32 product (S = 1)."""
    if _use_triton(impl, x) and x.shape[0] <= MAX_ROWS and splits > 1:
        from kernels.quant_linear_triton import int4_linear_triton

        return int4_linear_triton(_unit_stride(x), words, pairs, splits=splits)
    return int4_linear(x, words, pairs, out_dtype=torch.float32, impl=impl)[None]


def int8_partials(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, splits: int, *,
                  impl: str = "auto") -> torch.Tensor:
    """As int4_partials, for an int8-row matrix."""
    if _use_triton(impl, x) and x.shape[0] <= MAX_ROWS and splits > 1:
        from kernels.quant_linear_triton import int8_linear_triton

        return int8_linear_triton(_unit_stride(x), codes, scale, splits=splits)
    return int8_linear(x, codes, scale, out_dtype=torch.float32, impl=impl)[None]


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, *, out_dtype: torch.dtype | None = None,
                impl: str = "auto") -> torch.Tensor:
    """x (M, K) @ (codes * scale[:, None])ᵀ -> (M, N) in `out_dtype` (default x's); the scale scales columns."""
    out_dtype = out_dtype or x.dtype
    if _use_triton(impl, x) and x.shape[0] <= MAX_ROWS:
        from kernels.quant_linear_triton import int8_linear_triton

        return int8_linear_triton(_unit_stride(x), codes, scale, out_dtype=out_dtype)
    y = _dense(x, codes.to(x.dtype), torch.float32) * scale.float()
    return y.to(out_dtype)


def _dense(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if out_dtype != torch.float32:
        return F.linear(x, w).to(out_dtype)
    if x.is_cuda and x.dtype != torch.float32:
        try:
            return torch.mm(x, w.t(), out_dtype=torch.float32)  # fp32 out of the GEMM itself: no cast launch
        except (RuntimeError, NotImplementedError, TypeError):  # a torch or GPU without fp32-out GEMMs
            pass
    return F.linear(x.float(), w.float())


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
