"""One GGUF matrix -> a QuantTensor in its runtime's format, reading the file's blocks a slice at a time."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from engine.quant.block_codes import held_layout, row_slices
from engine.quant.gguf_blocks import FLOAT, NATIVE, dequantized_rows, int4_groups
from engine.quant.weight import (BlockRows, Int8Rows, QuantTensor, bf16_tensor, choose_format, mxfp4_blocks,
                                 mxfp4_words, pack_int4, superblocks)


def quantized_matrix(t: Any, row_order: torch.Tensor | None, device: str = "cpu", tiles: bool = True) -> QuantTensor:
    """`t` a gguf ReaderTensor of two dimensions; `row_order` the rows' new order (llama.cpp's Q/K permutation
    undone) or None. On the CPU's own kernel every common type keeps its codes (block_codes); with torch's kernels
    4-bit types keep their codes exactly and other quantized types become int8 rows; floats bf16.
    The layout is `device`'s (built on the CPU; the caller moves it). `tiles` False keeps super-blocks out of the AMX
    tiles' groups (a mixture's experts: its one-call expert kernels read them in rows)."""
    type_name = t.tensor_type.name
    n, k = int(t.shape[1]), int(t.shape[0])  # GGUF lists dims innermost first
    if type_name == "MXFP4":
        return mxfp4_matrix(np.asarray(t.data).reshape(n, -1), n, k, row_order, device)
    fmt = choose_format(type_name, n, k, device)
    if fmt == "blocks" and held_layout(type_name, k).raw:
        return superblocks(np.asarray(t.data).reshape(n, -1), type_name, row_order, tiles)
    if fmt == "blocks":
        out = BlockRows(n, k, type_name)
        for start, codes in row_slices(t.tensor_type, type_name, t.data, n, k):
            out.put(start, codes)
        return out.done(row_order)
    if fmt == "int4":
        g = int4_groups(type_name, t.data, n, k)
        if row_order is not None:
            g.codes, g.scale, g.zero = (a[row_order.numpy()] for a in (g.codes, g.scale, g.zero))
        return pack_int4(g, type_name, device)
    return _float_rows(fmt, t.tensor_type, type_name, t.data, n, k, row_order)


def _float_rows(fmt: str, type_id, type_name: str, raw, n: int, k: int,
                row_order: torch.Tensor | None) -> QuantTensor:
    """A matrix of any type gguf reads, from its dequantized rows a slice at a time: bf16 (`fmt`), else int8 rows."""
    if fmt == "bf16":
        w = torch.empty(n, k, dtype=torch.bfloat16)
        for start, rows in dequantized_rows(type_id, raw, n, k):
            w[start:start + len(rows)] = torch.from_numpy(rows)
        return bf16_tensor(w if row_order is None else w[row_order], type_name)
    out = Int8Rows(n, k)
    for start, rows in dequantized_rows(type_id, raw, n, k):
        out.put(start, rows)
    if row_order is not None:
        out.codes, out.scale = out.codes[row_order], out.scale[row_order]
    return out.done(type_name)


def mxfp4_matrix(raw: np.ndarray, n: int, k: int, row_order: torch.Tensor | None, device: str) -> QuantTensor:
    """An (n, k) MXFP4 matrix from its GGUF block bytes (n, k/32 · 17), a file's or a folder's (engine/quant/mxfp4.py):
    the CPU's own kernels and CUDA keep its 4-bit floats as they are; elsewhere, or with scales beyond CUDA's (2^2 and
    up), int8 rows (or bf16 where K does not suit them) of its exact values."""
    fmt = choose_format("MXFP4", n, k, device)
    if fmt == "blocks":  # the file's nibbles are the kernel's indices: no decode
        return mxfp4_blocks(raw, k, row_order)
    held = mxfp4_words(raw, k, row_order) if fmt == "fp4" else None
    if held is not None:
        return held
    import gguf

    return _float_rows("int8" if fmt == "fp4" else fmt, gguf.GGMLQuantizationType.MXFP4, "MXFP4", raw, n, k,
                       row_order)


def is_native(type_name: str) -> bool:
    """Types read without a notice: the common files' quantizations and the float types."""
    return type_name in NATIVE or type_name in FLOAT


def row_order(fix, name: str, n: int, args) -> torch.Tensor | None:
    """The row permutation an architecture's `gguf_fix` applies to `name` (None when it keeps the order): the fix
    only ever moves rows, so applying it to the row indices tells where each row goes."""
    idx = torch.arange(n, dtype=torch.float64)[:, None]
    moved = fix(name, idx, args)[:, 0].long()
    return None if torch.equal(moved, torch.arange(n)) else moved

