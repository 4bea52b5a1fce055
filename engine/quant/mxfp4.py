"""A folder's MXFP4 matrices (gpt-oss's experts as transformers stores them) kept 4-bit at load: `Mxfp4Rows` carries
a matrix's blocks through an architecture's sanitize (experts split, rows chosen) and becomes the runtime's format
only then, the same one a GGUF file's MXFP4 tensor gets (engine/quant/from_gguf.py `mxfp4_matrix`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.errors import ModelLoadError
from kernels.quant_linear import FP4_VALUES


@dataclass(frozen=True, slots=True)
class Mxfp4Rows:
    """An (N, K) MXFP4 matrix as a folder stores it: `blocks` (N, K/32, 16) uint8, two 4-bit floats a byte (element
    2j low, 2j + 1 high), `scales` (N, K/32) uint8 exponents biased by 127."""

    blocks: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape[0], self.blocks.shape[1] * 32

    def rows(self, index) -> Mxfp4Rows:
        """The rows `index` selects (an int, a slice or a step): gate and up de-interleaved, one expert of a stack."""
        return Mxfp4Rows(self.blocks[index], self.scales[index])

    def dequantize(self) -> torch.Tensor:
        return dequantize_mxfp4(self.blocks, self.scales)

    def file_blocks(self) -> np.ndarray:
        """The matrix as a GGUF file holds MXFP4: (N, K/32 · 17) bytes, each block its exponent byte, then element j
        low in byte j and j + 16 high."""
        b = self.blocks.numpy()
        n, g = b.shape[:2]
        elements = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, g, 32)
        packed = elements[..., :16] | (elements[..., 16:] << 4)
        return np.concatenate([self.scales.numpy()[..., None], packed], axis=-1).reshape(n, g * 17)

    def held(self, device: str):
        """The matrix in `device`'s runtime format, built on the CPU (the caller moves it)."""
        from engine.quant.from_gguf import mxfp4_matrix

        return mxfp4_matrix(self.file_blocks(), *self.shape, None, device)


def stacked_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, name: str) -> list[Mxfp4Rows]:
    """A folder's stacked (E, N, K/32, 16) blocks and (E, N, K/32) scales as one Mxfp4Rows per expert."""
    _check(blocks, scales, f"{name}: ", dims=4)
    return [Mxfp4Rows(blocks[e], scales[e]) for e in range(blocks.shape[0])]


def _check(blocks: torch.Tensor, scales: torch.Tensor, where: str = "", dims: int | None = None) -> None:
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape \
            or blocks.shape[-1] != 16 or (dims is not None and blocks.dim() != dims):
        raise ModelLoadError(f"{where}MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not "
                             "match.")


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 (…, groups, 16) bytes — two 4-bit floats each, low nibble first — and (…, groups) power-of-two scales
    (biased by 127) -> fp32 (…, groups · 32)."""
    _check(blocks, scales)
    values = torch.stack((FP4_VALUES[(blocks & 0x0F).long()], FP4_VALUES[(blocks >> 4).long()]), dim=-1).flatten(-2)
    values = torch.ldexp(values, (scales.to(torch.int32) - 127)[..., None])
    return values.flatten(-2)
