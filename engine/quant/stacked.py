"""StackedRows: one matrix whose row blocks are held in different CUDA formats, multiplied in one partials buffer.

A Q4_K_M file keeps attn_v in Q6_K in half the layers (llama.cpp's "more bits" rule), so q and k are int4 on CUDA and
v int8 rows: they cannot concatenate into one format (`concat_rows`), and unfused the layer paid three GEMM launches,
two q/k norm-rope launches and a K/V write where a fused one pays a GEMM and one prologue. Stacked, each format's
rows run their own kernel into a column range of the same split-K partials (the same K slices), so the consumer
(the fused q/k/v prologue) sees one matrix.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.quant.weight import QuantTensor, WeightMatrix, concat_rows
from kernels.quant_linear import WORDS


class StackedRows(WeightMatrix):
    """An (N, K) weight whose rows are `parts`' rows in order (int4 and int8 blocks on CUDA); the QuantTensor calls a
    QuantLinear makes: `forward`, `partials`, `decode_splits`, `rows`, `dequantize`."""

    def __init__(self, parts: list[QuantTensor]):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        self.format = "+".join(p.format for p in parts)
        self.source_type = "+".join(dict.fromkeys(p.source_type for p in parts))
        self._splits: int | None = None
        self.impl = "auto"  # kernels.attention's switch: "triton" runs the kernels on the CPU too (TRITON_INTERPRET)

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is not None:
            raise ValueError("only the CPU's blocks product takes a bias")
        lead, x2 = x.shape[:-1], x.reshape(-1, x.shape[-1])
        if self._kernels(x2):
            y = torch.empty(x2.shape[0], self.shape[0], dtype=out_dtype or x.dtype, device=x.device)
            self._into(x2, y, 1)
        else:
            y = torch.cat([p(x2, out_dtype) for p in self.parts], dim=-1)
        return y.reshape(*lead, self.shape[0])

    def partials(self, x: torch.Tensor, splits: int) -> torch.Tensor:
        """x (T, K) @ Wᵀ as split-K fp32 partials (S, T, N) on CUDA, every part in the same K slices; else the product."""
        if not (splits > 1 and self._kernels(x)):
            return self(x)
        slices = {_slices_of(p, splits) for p in self.parts}
        if len(slices) > 1:  # the parts would cut K differently: one slice (S = 1) is partials too
            splits, slices = 1, {1}
        y = torch.empty(slices.pop(), x.shape[0], self.shape[0], dtype=torch.float32, device=x.device)
        self._into(x, y if splits > 1 else y[0], splits)
        return y

    def _kernels(self, x: torch.Tensor) -> bool:
        from kernels.attention import _use_triton
        from kernels.quant_linear import MAX_ROWS

        return _use_triton(self.impl, x) and x.dim() == 2 and x.shape[0] <= MAX_ROWS

    def _into(self, x: torch.Tensor, y: torch.Tensor, splits: int) -> None:
        # each part's kernel writes its column range of y (partials when splits > 1)
        from kernels.quant_linear import _unit_stride
        from kernels.quant_linear_triton import int4_linear_triton, int8_linear_triton

        x, start = _unit_stride(x), 0
        for p in self.parts:
            out = y[..., start:start + p.shape[0]]
            if p.format in WORDS:
                int4_linear_triton(x, p.words, p.pairs, splits=splits, out=out, out_dtype=y.dtype)
            else:
                int8_linear_triton(x, p.codes, p.scale, splits=splits, out=out, out_dtype=y.dtype)
            start += p.shape[0]

    def decode_splits(self) -> int:
        """The largest part's K slices where every part splits K into as many (else 0: one product, no partials)."""
        if self._splits is None:
            first = max(self.parts, key=lambda p: p.nbytes())
            want = first.decode_splits()
            self._splits = want if want > 1 and len({_slices_of(p, want) for p in self.parts}) == 1 else 0
        return self._splits

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.reshape(-1)
        out = torch.empty(ids.numel(), self.shape[1], device=ids.device)
        start = 0
        for p in self.parts:
            mine = (ids >= start) & (ids < start + p.shape[0])
            out[mine] = p.rows(ids[mine] - start)
            start += p.shape[0]
        return out

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


def _slices_of(p: QuantTensor, splits: int) -> int:
    from kernels.quant_linear_triton import int4_slices, int8_slices

    interpret = next(p.buffers()).device.type == "cpu"
    if p.format in WORDS:
        return int4_slices(p.shape[0], p.pairs.shape[1], splits, interpret)  # pairs: (rows or tiles, chunks, ...)
    return int8_slices(p.shape[1], splits, interpret)


def stack_rows(parts: list[QuantTensor]) -> StackedRows | None:
    """The parts' rows as one matrix where their formats differ on CUDA (int4 and int8 rows), adjacent parts of one
    format concatenated (one launch each); None where a part is not a CUDA int4/int8 matrix."""
    if not all((p.format in WORDS or p.format == "int8") and next(p.buffers()).is_cuda for p in parts):
        return None
    if any(p.format in WORDS and not hasattr(p, "words") for p in parts):
        return None
    runs: list[list[QuantTensor]] = []
    for p in parts:
        if runs and runs[-1][0].format == p.format:
            runs[-1].append(p)
        else:
            runs.append([p])
    return StackedRows([run[0] if len(run) == 1 else concat_rows(run) for run in runs])
