"""One-row attention over the KV cache in place (kernels/cpu/attend.c, built by kernels/cpu_native.py), with its plain
PyTorch reference (`impl="reference"`): decode rows and verify rows, each over its own list of cache rows."""
from __future__ import annotations

import torch

from kernels import cpu_native
from kernels.reference import capped, sink_softmax

CACHE_DTYPES = (torch.float32, torch.float16)  # KV cache storage attend.c reads (and rope.c writes)


def attend_rows(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, keys: torch.Tensor, table: torch.Tensor,
                scale: float, out: torch.Tensor, *, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                impl: str = "auto") -> None:
    """For each table entry (query row, offset, count): out[row] = softmax(scale · q[row] · kᵀ) · v over the cache rows
    keys[offset : offset + count] (scores capped as `capped` when softcap > 0; `sinks` (H,) fp32 as `sink_softmax`). q, out (T, H, D) fp32; k_rows, v_rows
    (rows, Hkv, D) fp32 or both fp16 (a half-size cache: widened exactly as read); keys int64; table (S, 3) int64.
    `impl` "auto"/"native" runs the C kernel, "reference" torch."""
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        attend_rows_reference(q, k_rows, v_rows, keys, table, scale, out, softcap, sinks)
        return
    kv = k_rows.dtype
    if kv not in CACHE_DTYPES or v_rows.dtype != kv \
            or any(t.dtype != torch.float32 for t in (q, out)) \
            or not all(t.is_contiguous() for t in (q, k_rows, v_rows, out)) \
            or (sinks is not None and (sinks.dtype != torch.float32 or not sinks.is_contiguous())):
        raise ValueError("attend_rows takes contiguous fp32 queries and fp32 or fp16 caches")
    _, h, d = q.shape
    call = kernel.lib.parley_attend_rows if kv == torch.float32 else kernel.lib.parley_attend_rows_f16
    rc = call(q.data_ptr(), k_rows.data_ptr(), v_rows.data_ptr(), keys.data_ptr(), table.data_ptr(), table.shape[0], h,
              k_rows.shape[1], d, scale, softcap, sinks.data_ptr() if sinks is not None else None, out.data_ptr(),
              torch.get_num_threads())
    if rc != 0:
        raise MemoryError("no memory for the attention scores")


def attention_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float = 0.0,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One query row over keys it all sees (a decode step, a verify row): q (1, H, D), k/v (Tk, Hkv, D) -> (1, H, D).
    Two batched matmuls and a softmax, 2.5× faster on the CPU than SDPA's GQA path at this size; every one-row
    attention goes through here, so a verify row computes exactly what a one-token step does."""
    hkv, d = k.shape[1], k.shape[2]
    qg = q.reshape(hkv, -1, d)  # the query heads sharing each KV head (H = Hkv · G, grouped as in enable_gqa)
    scores = capped(torch.bmm(qg, k.permute(1, 2, 0)) * scale, softcap)
    sink = None if sinks is None else sinks.view(hkv, -1, 1)
    return torch.bmm(sink_softmax(scores, sink).to(v.dtype), v.transpose(0, 1)).reshape(q.shape)


def attend_rows_reference(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, keys: torch.Tensor,
                          table: torch.Tensor, scale: float, out: torch.Tensor, softcap: float = 0.0,
                          sinks: torch.Tensor | None = None) -> None:
    for row, at, n in table.tolist():
        idx = keys[at:at + n]
        out[row:row + 1] = attention_row(q[row:row + 1], k_rows.index_select(0, idx), v_rows.index_select(0, idx),
                                         scale, softcap, sinks)
