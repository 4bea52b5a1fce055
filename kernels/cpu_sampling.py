"""Sampling on the CPU, one library call each (kernels/cpu/sampling.c), without a softmax written out over the whole
row: each row's k most likely tokens and their probabilities (`top_rows`), a draw from the whole row (`draw_rows`),
or a draw among each row's top-k tokens with its top-p and min-p (`sample_top`); and the penalties written into the
rows and taken back (`penalise_rows`).
torch is the reference: engine/sampling.py runs its softmax, topk and `_inverse_cdf` where the library is not built."""
from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.cpu_native import cpu_kernel


def _rows(rows: torch.Tensor):
    """The library and the rows as it reads them (fp32, contiguous), or None where it does not apply."""
    kernel = cpu_kernel() if rows.device.type == "cpu" and rows.dim() == 2 and rows.shape[1] else None
    if kernel is None:
        return None
    return kernel, rows if rows.dtype == torch.float32 and rows.is_contiguous() else rows.float().contiguous()


def draw_rows(rows: torch.Tensor, temperatures: list[float], uniforms: list[float]) -> torch.Tensor | None:
    """rows (R, V) logits -> (R,) ids: where softmax(row / T)'s cumulative sum passes u times its total (u in [0, 1)),
    a token of probability 0 never. None where the library does not apply."""
    found = _rows(rows)
    if found is None:
        return None
    kernel, x = found
    temps = torch.tensor(temperatures, dtype=torch.float32)
    u = torch.tensor(uniforms, dtype=torch.float64)
    ids = torch.empty(x.shape[0], dtype=torch.int64)
    if kernel.lib.parley_draw_rows(x.data_ptr(), x.shape[0], x.shape[1], temps.data_ptr(), u.data_ptr(),
                                   ids.data_ptr(), torch.get_num_threads()):
        return None
    return ids


def top_rows(rows: torch.Tensor, temperatures: list[float], k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """rows (R, V) logits, 1 <= k <= V -> (probabilities (R, k) fp32, descending, ids (R, k)): softmax(row / T)'s k
    largest, equal values at the smaller id first. None where the library does not apply (not built, not on the
    CPU, or it could not get its scratch memory)."""
    found = _rows(rows) if 1 <= k <= rows.shape[-1] else None
    if found is None:
        return None
    kernel, x = found
    n_rows = x.shape[0]
    temps = torch.tensor(temperatures, dtype=torch.float32)
    ids = torch.empty(n_rows, k, dtype=torch.int64)
    maxes = torch.empty(n_rows, dtype=torch.float32)
    sums = torch.empty(n_rows, dtype=torch.float64)
    if kernel.lib.parley_top_rows(x.data_ptr(), n_rows, x.shape[1], k, temps.data_ptr(), ids.data_ptr(),
                                  maxes.data_ptr(), sums.data_ptr(), torch.get_num_threads()):
        return None
    scaled = x.gather(1, ids) / temps[:, None] - maxes[:, None] / temps[:, None]  # rounded as softmax(x / t)'s inputs
    return (scaled.exp() / sums[:, None].float()), ids


def sample_top(rows: torch.Tensor, top_k: list[int], temperatures: list[float], top_p: list[float],
               min_p: list[float], uniforms: list[float]) -> torch.Tensor | None:
    """rows (R, V) logits, per row 0 <= top_k <= V (0: none) -> (R,) ids: softmax(row / T)'s top_k most likely tokens
    (all without one), the prefix of them top-p and min-p keep (the first always), and among those, in id order,
    where their cumulative sum passes u times their total. None where the library does not apply (or, past 2**31
    tokens, cannot)."""
    found = _rows(rows) if all(0 <= k <= rows.shape[-1] for k in top_k) and rows.shape[-1] < 2**31 else None
    if found is None:
        return None
    kernel, x = found
    ks = torch.tensor(top_k, dtype=torch.int64)
    temps = torch.tensor(temperatures, dtype=torch.float32)
    p, m, u = (torch.tensor(v, dtype=torch.float64) for v in (top_p, min_p, uniforms))
    ids = torch.empty(x.shape[0], dtype=torch.int64)
    if kernel.lib.parley_sample_top(x.data_ptr(), x.shape[0], x.shape[1], ks.data_ptr(), temps.data_ptr(),
                                    p.data_ptr(), m.data_ptr(), u.data_ptr(), ids.data_ptr(), torch.get_num_threads()):
        return None
    return ids


def penalise_rows(logits: torch.Tensor, rows: list[int], hist: torch.Tensor, factors: list[list[float]],
                  counts: torch.Tensor | None) -> Callable[[], None] | None:
    """Penalises `rows` of `logits` (R, V) fp32, contiguous, on the CPU, in place, in one call: `hist` (P, H) int64 their
    ids (V or more: padding), `factors` per row (repetition, presence, frequency), `counts` (P, H) each entry's id's
    count (None: no frequency penalty). Returns what puts the values back; None where the library does not apply."""
    kernel = cpu_kernel() if logits.device.type == "cpu" and logits.dtype == torch.float32 else None
    if kernel is None or not logits.is_contiguous() or logits.dim() != 2:
        return None
    P, H = hist.shape
    index = torch.tensor(rows, dtype=torch.int64)
    hist = hist.contiguous()
    table = torch.tensor(factors, dtype=torch.float32).reshape(P, 3)
    counts = counts.float().contiguous() if counts is not None else None
    original = torch.empty(P, H, dtype=torch.float32)

    def call(restore: int) -> None:
        kernel.lib.parley_penalise_rows(logits.data_ptr(), logits.shape[1], P, index.data_ptr(), hist.data_ptr(), H,
                                        table.data_ptr(), counts.data_ptr() if counts is not None else None,
                                        original.data_ptr(), restore)

    call(0)
    return lambda: call(1)
