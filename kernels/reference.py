"""Plain PyTorch versions of the kernels: the CPU path and the oracle for the Triton tests.

Storage layout (DESIGN.md §4, layout `sequence`): per layer, K and V are each
`[rows, C, Hkv, D]`; a token of the sequence in column `c` at absolute position `p`
lives at row `p % rows`. A step's segment table `seq_info: int32[S, 4]` holds
`(q_start, q_len, column, kv_end)` per segment.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Q_START, Q_LEN, COLUMN, KV_END = range(4)


def key_range(qpos: int, kv_end: int, *, causal: bool, window: int | None) -> tuple[int, int]:
    """Inclusive range [lo, hi] of key positions that query position `qpos` attends to."""
    lo = max(0, qpos - window + 1) if window else 0
    hi = qpos if causal else kv_end - 1
    return lo, hi


def sdpa_varlen_reference(
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
) -> torch.Tensor:  # (T, H, D), q's dtype
    """Varlen attention by gather + `scaled_dot_product_attention` with an explicit mask (`masked_sdpa`).

    Reads the segment table on the host (fine on CPU; it is not graph-safe). Checks that
    the planned bounds `max_q_len` / `max_kv_len` really bound the table, because the
    Triton kernel sizes its grid from them and would silently skip rows past them.
    `rows_are_ring` and `num_splits` are accepted for signature parity and ignored:
    `p % rows` is right for both flat and ring storage.
    """
    del rows_are_ring, num_splits
    T, H, D = q.shape
    rows, _, Hkv, _ = k_cache.shape
    assert H % Hkv == 0, "query heads must be a multiple of KV heads"
    G = H // Hkv
    # Softmax in fp32 (or fp64 when the caller asks for an fp64 oracle).
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.zeros(T, H, D, dtype=work, device=q.device)
    for q_start, q_len, column, kv_end in seq_info.tolist():
        if q_len == 0:
            continue
        if q_len > max_q_len or kv_end > max_kv_len:
            raise ValueError(
                f"segment (q_len={q_len}, kv_end={kv_end}) exceeds the planned bounds "
                f"max_q_len={max_q_len}, max_kv_len={max_kv_len}"
            )
        if kv_end < q_len:
            raise ValueError(f"kv_end={kv_end} < q_len={q_len}: this step's keys must be written")
        qpos = torch.arange(kv_end - q_len, kv_end, device=q.device)  # (q_len,)
        lo = key_range(kv_end - q_len, kv_end, causal=causal, window=window)[0]
        if window and kv_end - lo > rows:
            raise ValueError(f"ring of {rows} rows cannot hold keys {lo}..{kv_end - 1}")
        pos = torch.arange(lo, kv_end, device=q.device)  # (L,)
        k = k_cache[pos % rows, column].to(work).transpose(0, 1)  # (Hkv, L, D)
        v = v_cache[pos % rows, column].to(work).transpose(0, 1)  # (Hkv, L, D)
        hi = qpos[:, None] if causal else torch.full_like(qpos[:, None], kv_end - 1)
        allowed = pos[None, :] <= hi  # (q_len, L)
        if window:
            allowed &= pos[None, :] >= qpos[:, None] - window + 1
        # Fold the G heads of a group into the query axis: (Hkv, G * q_len, D).
        qs = q[q_start : q_start + q_len].to(work)
        qs = qs.view(q_len, Hkv, G, D).permute(1, 2, 0, 3).reshape(Hkv, G * q_len, D)
        mask = allowed.repeat(G, 1)  # (G * q_len, L)
        sink = None if sinks is None else sinks.to(work).view(Hkv, G, 1, 1).expand(Hkv, G, q_len, 1).reshape(Hkv, -1, 1)
        o = masked_sdpa(qs, k, v, mask, scale, softcap, sink)
        o = o.view(Hkv, G, q_len, D).permute(2, 0, 1, 3).reshape(q_len, H, D)
        out[q_start : q_start + q_len] = o
    return out.to(q.dtype)


def capped(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    """Gemma 2's attention logit cap, softcap · tanh(score / softcap); the scores as they are when softcap is 0."""
    return softcap * torch.tanh(scores / softcap) if softcap else scores


def sink_softmax(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis; with `sinks` (broadcast to scores' (..., 1)) each row's sink logit joins the
    softmax as a key without a value (gpt-oss's attention sinks), so the row's weights sum to less than 1."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def masked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scores) · v with scores = scale · q·kᵀ, or softcap · tanh(scale · q·kᵀ / softcap) when `softcap` > 0
    (Gemma 2), masked where `mask` is False; `sinks` (broadcast to (..., M, 1)) as `sink_softmax`. q (..., M, D),
    k/v (..., L, D) with the same leading dims."""
    if not softcap and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = capped(torch.matmul(q, k.transpose(-1, -2)) * scale, softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(sink_softmax(scores, sinks), v)


def kv_write_reference(
    k_cache: torch.Tensor,  # (rows, C, Hkv, D)
    v_cache: torch.Tensor,  # (rows, C, Hkv, D)
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    slots: torch.Tensor,  # (T,) int64, slot = row * C + column
) -> None:
    """Write each token's K and V at its flat slot of the `[rows * C]` view, in place."""
    rows, C, Hkv, D = k_cache.shape
    k_cache.view(rows * C, Hkv, D).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(rows * C, Hkv, D).index_copy_(0, slots, v.to(v_cache.dtype))
