"""KVCache: the interface every layout shares; the step protocol is declare -> prepare -> attend* -> commit (or
abort). The `sequence` layout on the kernels takes its step plan from the runner in between (`bind_step`)."""
from __future__ import annotations

from typing import Protocol

import torch

from engine.cache.book import CacheBook, Segment
from engine.cache.config import CacheConfig
from kernels.cpu_attend import CACHE_DTYPES as NATIVE_DTYPES, attention_row


class CacheObserver(Protocol):
    def on_clone(self, src: int, dst: int) -> None:
        """Slot `dst` now holds a copy of slot `src`'s positions."""

    def on_cut(self, slot: int, length: int) -> None:
        """Slot `slot` now holds its first `length` positions only (0: removed)."""


class KVCache:
    """Owns K/V bytes and attention semantics; layers call `attend(layer_id, q, k, v, scale)`."""

    def __init__(self, config: CacheConfig, windows: list[int | None], kv_heads: int, head_dim: int, device):
        self.config = config
        self.windows = windows  # per layer: sliding window or None
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.device = torch.device(device)
        self.book = CacheBook(config.max_seqs, config.max_seq_len, config.max_step_tokens, self._rings())
        self.segments: list[Segment] = []
        self.num_tokens = 0  # rows of this step's flat token axis, padding included
        # what keeps per-slot state beside the cache (a DFlash drafter's context): told of every copy, cut and
        # removal, so that state follows the cache through forks, parked prefixes and rewinds
        self.observers: list[CacheObserver] = []

    def _rings(self) -> dict[int, int]:
        return {}

    @property
    def pooled(self) -> bool:
        """Whether the sequences share one pool of storage, so that a sequence removed gives memory to the others."""
        return False

    # -- sequences
    @property
    def max_seqs(self) -> int:
        return self.config.max_seqs

    def seq_new(self) -> int:
        return self.book.seq_new()

    @torch.inference_mode()
    def seq_clone(self, src: int) -> int:
        dst = self.book.seq_clone(src)
        self._copy_sequence(src, dst)
        for o in self.observers:
            o.on_clone(src, dst)
        return dst

    @torch.inference_mode()
    def seq_rm(self, slot: int) -> None:
        self.book.seq_rm(slot)
        self._drop_from(slot, 0)
        for o in self.observers:
            o.on_cut(slot, 0)

    @torch.inference_mode()
    def rewind(self, slot: int, pos: int) -> None:
        self.book.rewind(slot, pos)
        self._drop_from(slot, pos)
        for o in self.observers:
            o.on_cut(slot, pos)

    def pos(self, slot: int) -> int:
        return self.book.pos(slot)

    def holds(self, end: int, tokens: int) -> bool:
        """Whether the storage holds, without growing, any step whose writes end by position `end` and number `tokens`
        in all (a layout that grows only inside its step: always)."""
        return True

    def reserve(self, writes: list[tuple[int, int]]) -> dict:
        """Grows the storage before a step for its (start position, tokens) writes, one per sequence; returns the
        writes (by index) refused for want of memory, each with its CacheMemoryError. A layout that grows only inside
        its step refuses nothing here."""
        return {}

    # -- step protocol
    def declare_step(self, writes: list[tuple[int, int]], rowwise: frozenset[int] = frozenset()) -> list[Segment]:
        """Host-side check and layout of a step: (slot, n_tokens) in flat-axis order; `rowwise` slots' rows each
        attend as a one-token step would (`attention_segments`)."""
        self.segments = self.book.declare(writes, rowwise)
        return self.segments

    @torch.inference_mode()
    def prepare_step(self, num_tokens: int | None = None) -> None:
        """Makes room for the declared step and plans its attention (where the layout plans it itself: a
        kernel plan comes from the runner, `bind_step`); rows past the segments are padding."""
        used = sum(s.q_len for s in self.segments)
        self.num_tokens = used if num_tokens is None else num_tokens
        assert self.num_tokens >= used, "the flat axis cannot be shorter than its segments"
        self._prepare()

    @property
    def has_pending_step(self) -> bool:
        """A step is declared and neither committed nor aborted."""
        return self.book.pending is not None

    def commit_step(self) -> None:
        self.book.commit()
        self.segments = []

    @torch.inference_mode()
    def abort_step(self) -> None:
        """Forgets the pending step; does nothing when none is pending."""
        if self.book.pending is None:
            return
        self._abort()
        self.book.abort()
        self.segments = []

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def native_rows(self) -> bool:
        """Whether every query row attends alone in the CPU library (an fp32 or fp16 cache on the CPU, the library
        built here). A row's result then depends on its query and its keys only, never on how its prompt was cut into
        steps: chunked prefill, a reused prefix, a verified draft and a one-token step all compute it alike."""
        from kernels.cpu_native import cpu_kernel

        return self.device.type == "cpu" and self.config.torch_dtype in NATIVE_DTYPES and cpu_kernel() is not None

    def direct_write(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(K store, V store, flat slots) for a kernel that writes this step's K/V itself, then calls
        `attend` with k = v = None; None where this layout has no such stores."""
        return None

    # -- layout hooks
    def _prepare(self) -> None:
        raise NotImplementedError

    def _abort(self) -> None:
        pass

    def _copy_sequence(self, src: int, dst: int) -> None:
        raise NotImplementedError

    def _drop_from(self, slot: int, pos: int) -> None:
        pass


def visible(key_pos: torch.Tensor, query_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """(Q, K) bool: causal, and inside the sliding window (distance < window) when there is one."""
    mask = key_pos[None, :] <= query_pos[:, None]
    if window:
        mask &= key_pos[None, :] > query_pos[:, None] - window
    return mask


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
              softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Reference SDPA: q (Tq, H, D), k/v (Tk, Hkv, D), mask (Tq, Tk) -> (Tq, H, D); softcap > 0 caps the scores,
    `sinks` (H,) join each head's softmax (kernels.reference.sink_softmax)."""
    if softcap or sinks is not None:  # SDPA has neither: scores by hand, each KV head repeated for its query heads
        from kernels.reference import masked_sdpa

        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        sink = None if sinks is None else sinks.view(-1, 1, 1)
        return masked_sdpa(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), mask, scale, softcap,
                           sink).transpose(0, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.transpose(0, 1)


def one_row_plan(segments, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The one-row queries of a step's segments, as the CPU kernel's key list and (row, offset, count) table.
    `segments`: (q_start, q_len, gather, mask); a one-row segment sees every key gathered, and each row j of a
    segment without a mask sees the keys up to its own position (the last q_len - 1 - j gathered are after it),
    cut to the window. Masked segments are left to `attention`."""
    keys, table, at = [], [], 0
    for q_start, q_len, gather, mask in segments:
        if q_len == 1:
            table.append((q_start, at, len(gather)))
        elif mask is None:
            n = len(gather) - q_len
            for j in range(q_len):
                hi = n + j + 1
                lo = max(0, hi - window) if window else 0
                table.append((q_start + j, at + lo, hi - lo))
        else:
            continue
        keys.append(gather.cpu())
        at += len(gather)
    flat = torch.cat(keys) if keys else torch.zeros(0, dtype=torch.long)
    return flat.long().contiguous(), torch.tensor(table, dtype=torch.long).reshape(-1, 3)


def attend_one_rows(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor],
                    scale: float, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Every row of `rows` (`one_row_plan`) attended in the CPU library; rows it does not name (padding, masked
    segments) are zero."""
    from kernels.cpu_attend import attend_rows

    keys, table = rows
    out = q.new_empty(q.shape) if table.shape[0] == q.shape[0] else q.new_zeros(q.shape)
    attend_rows(q.contiguous(), k_rows, v_rows, keys, table, scale, out, softcap=softcap, sinks=sinks)
    return out


def attend_segments(q: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, segments: list, rows, window: int | None,
                    scale: float, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Each segment over its own keys, gathered in position order from the flat stores `kf` / `vf`: one-row queries in
    the CPU library where `rows` (`one_row_plan`) is planned, a masked segment in one call, a rowwise one row by row.
    A row's result depends on its sequence's keys only, never on the other sequences of its step."""
    if rows is not None and q.dtype == torch.float32:  # every one-row query in one call, in place
        out = attend_one_rows(q, kf, vf, rows, scale, softcap, sinks)
        segments = [s for s in segments if s[1] > 1 and s[3] is not None]
    else:
        out = q.new_zeros(q.shape)
    for q_start, q_len, gather, mask in segments:
        keys, values = kf.index_select(0, gather).to(q.dtype), vf.index_select(0, gather).to(q.dtype)
        if q_len == 1:  # a decode row sees every key gathered (the window already cut them)
            out[q_start : q_start + 1] = attention_row(q[q_start : q_start + 1], keys, values, scale, softcap, sinks)
            continue
        if mask is not None:
            out[q_start : q_start + q_len] = attention(q[q_start : q_start + q_len], keys, values, mask, scale,
                                                       softcap, sinks)
            continue
        n = len(gather) - q_len  # keys before the segment's first row
        for j in range(q_len):  # rowwise: each row over its own keys, as a one-token step computes it
            hi = n + j + 1
            lo = max(0, hi - window) if window else 0
            out[q_start + j : q_start + j + 1] = attention_row(q[q_start + j : q_start + j + 1], keys[lo:hi],
                                                               values[lo:hi], scale, softcap, sinks)
    return out
