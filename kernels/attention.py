"""Public attention ops with an implementation switch.

`impl="triton"` runs the Triton kernels (CUDA tensors, or CPU tensors under
TRITON_INTERPRET=1), `impl="reference"` the plain PyTorch versions, and `impl="auto"`
Triton on CUDA tensors when Triton is installed, the reference otherwise.
Triton is imported only when a Triton path runs, so this module loads without it.
"""

from __future__ import annotations

import importlib.util

import torch

from kernels.reference import kv_write_reference, sdpa_varlen_reference

IMPLS = ("auto", "triton", "reference")


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _use_triton(impl: str, t: torch.Tensor) -> bool:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return t.is_cuda and triton_available()
    return impl == "triton"


def sdpa_varlen(
    q: torch.Tensor,  # (T, H, D)
    k_cache: torch.Tensor,  # (rows, C, Hkv, D)
    v_cache: torch.Tensor,  # (rows, C, Hkv, D)
    seq_info: torch.Tensor,  # (S, 4) int32: q_start, q_len, column, kv_end
    *,
    scale: float,
    max_q_len: int,
    max_kv_len: int,
    causal: bool = True,
    window: int | None = None,
    rows_are_ring: bool | None = None,
    num_splits: int | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:  # (T, H, D), q's dtype
    """Attention of a packed step's queries over each segment's column of the KV store.

    Query i of a segment has position `kv_end - q_len + i` and attends to key positions
    `max(0, qpos - window + 1) .. qpos` (causal) or `.. kv_end - 1` (non-causal); `window`
    None or 0 means unbounded. Keys live at row `p % rows`. `max_q_len` and `max_kv_len`
    are host-side upper bounds planned before the step (they size the grid); lengths are
    read on the device. Rows that no segment covers come back zero. `rows_are_ring`
    defaults to `bool(window)`; `num_splits` (None: planned from the bounds) forces the
    split-K width. `softcap` > 0 caps each score as softcap · tanh(score / softcap) (Gemma 2).
    `sinks` (H,) fp32: a logit per query head that joins every row's softmax without a value (gpt-oss).
    """
    kwargs = dict(
        scale=scale, max_q_len=max_q_len, max_kv_len=max_kv_len, causal=causal,
        window=window, rows_are_ring=rows_are_ring, num_splits=num_splits, softcap=softcap, sinks=sinks,
    )
    if _use_triton(impl, q):
        from kernels.sdpa_varlen_triton import sdpa_varlen_triton

        return sdpa_varlen_triton(q, k_cache, v_cache, seq_info, **kwargs)
    return sdpa_varlen_reference(q, k_cache, v_cache, seq_info, **kwargs)


def kv_write(
    k_cache: torch.Tensor,  # (rows, C, Hkv, D)
    v_cache: torch.Tensor,  # (rows, C, Hkv, D)
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    slots: torch.Tensor,  # (T,) int64, slot = row * C + column
    *,
    impl: str = "auto",
) -> None:
    """Write each token's K and V at its flat slot of the `[rows * C]` storage view, in place."""
    if _use_triton(impl, k):
        from kernels.kv_write_triton import kv_write_triton

        kv_write_triton(k_cache, v_cache, k, v, slots)
    else:
        kv_write_reference(k_cache, v_cache, k, v, slots)
