"""Layout `sequence`: per layer [rows, max_seqs + 1, kv_heads, head_dim]; a column per sequence, the last one scratch."""
from __future__ import annotations

import torch

from engine.cache.base import KVCache, attention, visible
from engine.cache.config import CacheConfig

MIN_ROWS = 16


class SequenceKVCache(KVCache):
    def __init__(self, config: CacheConfig, windows: list[int | None], kv_heads: int, head_dim: int, device="cpu"):
        super().__init__(config, windows, kv_heads, head_dim, device)
        self.columns = config.max_seqs + 1
        self.scratch = config.max_seqs
        self.rows = max(MIN_ROWS, -(-config.initial_capacity // config.max_seqs))
        self.rows = min(self.rows, config.max_seq_len)
        self.k = [self._alloc(self._layer_rows(w)) for w in windows]
        self.v = [self._alloc(self._layer_rows(w)) for w in windows]
        self._step: dict = {}

    def _rings(self) -> dict[int, int]:
        rings = {}
        for w in set(self.windows) - {None}:
            rows = self.config.ring_rows(w)
            if rows < self.config.max_seq_len:  # a ring as long as the context never wraps
                rings[w] = rows
        return rings

    def ring_rows(self, window: int | None) -> int | None:
        return self.book.rings.get(window) if window else None

    def _layer_rows(self, window: int | None) -> int:
        ring = self.ring_rows(window)
        return self.rows if ring is None else min(self.rows, ring)

    def _alloc(self, rows: int) -> torch.Tensor:
        shape = (rows, self.columns, self.kv_heads, self.head_dim)
        return torch.zeros(shape, dtype=self.config.torch_dtype, device=self.device)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    # -- growth: global layers by whole rows; a ring grows like a flat layer until it reaches its size
    def _grow(self, needed: int) -> None:
        rows = self.rows
        while rows < needed:
            rows = min(self.config.max_seq_len, rows * 2)
        if rows == self.rows:
            return
        self.rows = rows
        for i, w in enumerate(self.windows):
            new_rows = self._layer_rows(w)
            if new_rows != self.k[i].shape[0]:
                self.k[i] = self._regrow(self.k[i], new_rows)
                self.v[i] = self._regrow(self.v[i], new_rows)

    def _regrow(self, old: torch.Tensor, rows: int) -> torch.Tensor:
        new = self._alloc(rows)
        new[: old.shape[0]] = old
        return new

    def _row(self, pos: torch.Tensor, window: int | None) -> torch.Tensor:
        ring = self.ring_rows(window)
        return pos if ring is None else pos % ring

    # -- step
    def _prepare(self) -> None:
        self._grow(max((s.start + s.q_len for s in self.segments), default=0))
        dev = self.device
        pos = torch.zeros(self.num_tokens, dtype=torch.long)
        col = torch.full((self.num_tokens,), self.scratch, dtype=torch.long)
        for s in self.segments:
            pos[s.q_start : s.q_start + s.q_len] = torch.arange(s.start, s.start + s.q_len)
            col[s.q_start : s.q_start + s.q_len] = s.slot
        plans = {}
        for w in set(self.windows):
            write = (self._row(pos, w) * self.columns + col).to(dev)
            plans[w] = (write, [self._segment_plan(s, w) for s in self.segments])
        self._step = plans

    def _segment_plan(self, s, window: int | None):
        """Gather indices of the keys this segment can see, in position order, and its mask."""
        qpos = torch.arange(s.start, s.start + s.q_len)
        lo = max(0, s.start - window + 1) if window else 0
        kpos = torch.arange(lo, s.start + s.q_len)
        gather = self._row(kpos, window) * self.columns + s.slot
        return s.q_start, s.q_len, gather.to(self.device), visible(kpos, qpos, window).to(self.device)

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        write, segments = self._step[self.windows[layer_id]]
        kf = self.k[layer_id].view(-1, self.kv_heads, self.head_dim)
        vf = self.v[layer_id].view(-1, self.kv_heads, self.head_dim)
        kf.index_copy_(0, write, k.to(kf.dtype))
        vf.index_copy_(0, write, v.to(vf.dtype))
        out = q.new_zeros(q.shape)  # rows that no segment covers stay zero
        for q_start, q_len, gather, mask in segments:
            keys, values = kf.index_select(0, gather).to(q.dtype), vf.index_select(0, gather).to(q.dtype)
            out[q_start : q_start + q_len] = attention(q[q_start : q_start + q_len], keys, values, mask, scale)
        return out

    def _copy_sequence(self, src: int, dst: int) -> None:
        for t in self.k + self.v:
            t[:, dst] = t[:, src]
