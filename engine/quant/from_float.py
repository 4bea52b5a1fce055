"""Float matrices (a Hugging Face folder's weights) quantized at load: `--quantize q8|q4`."""
from __future__ import annotations

import numpy as np
import torch

from engine.quant.gguf_blocks import GROUP, Int4Groups
from engine.quant.weight import Int8Rows, QuantTensor, bf16_tensor, int4_fits, int8_fits, pack_int4

SCHEMES = ("q8", "q4")


def quantize_matrix(w: torch.Tensor, scheme: str) -> QuantTensor:
    """q8: int8 rows; q4: 4-bit groups of 32 (min–max), falling back to int8 rows (or bf16) where the shape
    does not fit the kernel."""
    n, k = w.shape
    w = w.float()
    if scheme == "q4" and int4_fits(n, k):
        return pack_int4(_int4_groups(w), "q4")
    if not int8_fits(k):
        return bf16_tensor(w, "float")
    out = Int8Rows(n, k)
    for start in range(0, n, 4096):  # bounded scratch
        out.put(start, w[start:start + 4096].numpy())
    return out.done("float")


def _int4_groups(w: torch.Tensor) -> Int4Groups:
    n, k = w.shape
    g = w.reshape(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    codes = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
    # w ≈ (q - 8) * scale + zero with zero = lo + 8 * scale
    return Int4Groups(codes.numpy(), scale.numpy().astype(np.float32), (lo + 8 * scale).numpy().astype(np.float32))
