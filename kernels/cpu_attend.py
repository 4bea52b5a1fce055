"""One-row attention over the KV cache in place (kernels/cpu/attend.c, built by kernels/cpu_native.py), with its plain
PyTorch reference (`impl="reference"`): decode rows and verify rows, each over its own list of cache rows."""
from __future__ import annotations

import torch

from kernels import cpu_native


def attend_rows(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, keys: torch.Tensor, table: torch.Tensor,
                scale: float, out: torch.Tensor, *, impl: str = "auto") -> None:
    """For each table entry (query row, offset, count): out[row] = softmax(scale · q[row] · kᵀ) · v over the cache rows
    keys[offset : offset + count]. q, out (T, H, D) fp32; k_rows, v_rows (rows, Hkv, D) fp32; keys int64; table
    (S, 3) int64. `impl` "auto"/"native" runs the C kernel, "reference" torch."""
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        attend_rows_reference(q, k_rows, v_rows, keys, table, scale, out)
        return
    for t in (q, k_rows, v_rows, out):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError("attend_rows takes contiguous fp32 tensors")
    _, h, d = q.shape
    rc = kernel.lib.parley_attend_rows(q.data_ptr(), k_rows.data_ptr(), v_rows.data_ptr(), keys.data_ptr(),
                                       table.data_ptr(), table.shape[0], h, k_rows.shape[1], d, scale,
                                       out.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise MemoryError("no memory for the attention scores")


def attend_rows_reference(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, keys: torch.Tensor,
                          table: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    from engine.cache.base import attention_row

    for row, at, n in table.tolist():
        idx = keys[at:at + n]
        out[row:row + 1] = attention_row(q[row:row + 1], k_rows.index_select(0, idx), v_rows.index_select(0, idx),
                                         scale)
