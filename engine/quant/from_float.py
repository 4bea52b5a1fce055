"""Float matrices (a Hugging Face folder's weights) quantized at load: `--quantize q8|q4`."""
from __future__ import annotations

import numpy as np
import torch

from engine.quant.block_codes import Codes, requantize
from engine.quant.gguf_blocks import GROUP, Int4Groups
from engine.quant.weight import (BlockRows, Int8Rows, QuantTensor, bf16_tensor, blocks_available, int4_fits,
                                 int8_fits, pack_int4)

SCHEMES = ("q8", "q4")


def quantize_matrix(w: torch.Tensor, scheme: str) -> QuantTensor:
    """q8: int8 rows; q4: 4-bit groups of 32 (min–max), falling back to int8 rows (or bf16) where the shape
    does not fit the kernel."""
    n, k = w.shape
    w = w.float()
    if k % GROUP == 0 and blocks_available():
        return _blocks(w, scheme)
    if scheme == "q4" and int4_fits(n, k):
        return pack_int4(_int4_groups(w), "q4")
    if not int8_fits(k):
        return bf16_tensor(w, "float")
    out = Int8Rows(n, k)
    for start in range(0, n, 4096):  # bounded scratch
        out.put(start, w[start:start + 4096].numpy())
    return out.done("float")


def _int4_groups(w: torch.Tensor) -> Int4Groups:
    codes, scale, lo = _min_max_groups(w, torch.float32)
    # w ≈ (q - 8) * scale + zero with zero = lo + 8 * scale
    return Int4Groups(codes.numpy(), scale.numpy().astype(np.float32), (lo + 8 * scale).numpy().astype(np.float32))


def _min_max_groups(w: torch.Tensor, held: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4-bit min–max groups of 32: codes (n, k) uint8, scale and minimum (n, k/32) as `held` rounds them (the codes
    are taken against those rounded values)."""
    n, k = w.shape
    g = w.reshape(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12).to(held).float()
    lo = lo.to(held).float()
    codes = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
    return codes, scale, lo


def _blocks(w: torch.Tensor, scheme: str) -> QuantTensor:
    """The CPU kernel's format: q8 symmetric int8 groups of 32, q4 min–max 4-bit groups of 32 (scale and offset)."""
    n, k = w.shape
    out = BlockRows(n, k, "Q8_0" if scheme == "q8" else "Q4_1")
    for start in range(0, n, 4096):  # bounded scratch
        rows = w[start:start + 4096]
        out.put(start, requantize(rows.numpy()) if scheme == "q8" else _min_max_4bit(rows))
    done = out.done()
    done.source_type = scheme
    return done


def _min_max_4bit(w: torch.Tensor) -> Codes:
    codes, scale, lo = _min_max_groups(w, torch.float16)  # the blocks format holds fp16 scales and offsets
    return Codes(codes.numpy(), scale.numpy(), lo.numpy())
