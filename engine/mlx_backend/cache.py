"""The `sequence` layout in MLX: per layer a flat [rows * (max_seqs + 1), kv_heads, head_dim] pool.

Row r of column c is flat index r * C + c, so growing appends rows without moving anything. It grows inside the memory
that is free, as the PyTorch layout does (engine/cache/rings.py): MLX's allocator ends the process where memory runs out
(a segfault on the CPU), so a growth that cannot fit is refused first, in one line. Positions and lengths come from the
host-side plan (the same CacheBook as PyTorch): no eval or host read inside an op. Fork copies a column; rewind only
moves the book (stale rows lie beyond the length).
"""
from __future__ import annotations

from functools import partial

import mlx.core as mx
import numpy as np

from engine.cache.base import KVCache
from engine.cache.book import attention_segments
from engine.cache.config import CacheConfig
from engine.cache.growth import free_bytes
from engine.cache.rings import MIN_ROWS, RingedLayout
from engine.errors import CacheConfigError

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


class MLXSequenceKVCache(RingedLayout, KVCache):
    def __init__(self, config: CacheConfig, windows: list[int | None], kv_heads: int, head_dim: int):
        if config.layout != "sequence":
            raise CacheConfigError("The MLX backend implements the `sequence` KV layout only.")
        super().__init__(config, windows, kv_heads, head_dim, "cpu")
        self.columns, self.scratch = config.max_seqs + 1, config.max_seqs
        self.rows = min(config.max_seq_len, max(MIN_ROWS, -(-config.initial_capacity // config.max_seqs)))
        self.k = [self._alloc(self._layer_rows(w)) for w in windows]
        self.v = [self._alloc(self._layer_rows(w)) for w in windows]
        self.free_memory = partial(free_bytes, self.device)  # what a growth may take (tests pass their own)
        self._step: dict = {}

    def _alloc(self, rows: int) -> mx.array:
        return mx.zeros((rows * self.columns, self.kv_heads, self.head_dim), dtype=DTYPES[self.config.dtype])

    def _held_rows(self, store: mx.array) -> int:
        return store.shape[0] // self.columns

    def _regrow(self, old: mx.array, rows: int) -> mx.array:
        new = mx.pad(old, [(0, rows * self.columns - old.shape[0]), (0, 0), (0, 0)])  # no zeros array beside it
        mx.eval(new)  # now, one tensor at a time: the peak the growth's check counted, not every layer's at the step
        return new

    def _row(self, pos: np.ndarray, window: int | None) -> np.ndarray:
        ring = self.ring_rows(window)
        return pos if ring is None else pos % ring

    def _prepare(self) -> None:
        self._grow(max((s.start + s.q_len for s in self.segments), default=0))
        pos = np.zeros(self.num_tokens, dtype=np.int64)
        col = np.full(self.num_tokens, self.scratch, dtype=np.int64)
        for s in self.segments:
            pos[s.q_start : s.q_start + s.q_len] = np.arange(s.start, s.start + s.q_len)
            col[s.q_start : s.q_start + s.q_len] = s.slot
        self._step = {
            w: (mx.array((self._row(pos, w) * self.columns + col).astype(np.int32)), [self._plan(s, w) for s in attention_segments(self.segments)])
            for w in set(self.windows)
        }

    def _plan(self, s, window: int | None):
        qpos = np.arange(s.start, s.start + s.q_len)
        lo = max(0, s.start - window + 1) if window else 0
        kpos = np.arange(lo, s.start + s.q_len)
        gather = (self._row(kpos, window) * self.columns + s.slot).astype(np.int32)
        mask = kpos[None, :] <= qpos[:, None]
        if window:
            mask &= kpos[None, :] > qpos[:, None] - window
        return s.q_start, s.q_len, mx.array(gather), mx.array(mask)

    def attend(self, layer_id: int, q: mx.array, k: mx.array, v: mx.array, scale: float,
               softcap: float = 0.0, sinks: mx.array | None = None) -> mx.array:
        write, segments = self._step[self.windows[layer_id]]
        kc, vc = self.k[layer_id], self.v[layer_id]
        kc[write] = k.astype(kc.dtype)
        vc[write] = v.astype(vc.dtype)
        parts, covered = [], 0
        for q_start, q_len, gather, mask in segments:
            qs = q[q_start : q_start + q_len].transpose(1, 0, 2)[None]  # (1, H, L, D)
            ks = kc[gather].astype(q.dtype).transpose(1, 0, 2)[None]  # (1, Hkv, S, D)
            vs = vc[gather].astype(q.dtype).transpose(1, 0, 2)[None]
            out = _capped_sdpa(qs, ks, vs, scale, mask, softcap) if softcap else \
                mx.fast.scaled_dot_product_attention(qs, ks, vs, scale=scale, mask=mask, sinks=sinks)
            parts.append(out[0].transpose(1, 0, 2))
            covered = q_start + q_len
        if covered < q.shape[0]:  # padding rows: no segment covers them
            parts.append(mx.zeros((q.shape[0] - covered,) + q.shape[1:], dtype=q.dtype))
        return mx.concatenate(parts) if len(parts) > 1 else parts[0]

    def _copy_sequence(self, src: int, dst: int) -> None:
        for lst in (self.k, self.v):
            for i, t in enumerate(lst):
                rows = t.shape[0] // self.columns
                base = np.arange(rows) * self.columns
                t[mx.array((base + dst).astype(np.int32))] = t[mx.array((base + src).astype(np.int32))]

    def arrays(self) -> list[mx.array]:
        return self.k + self.v


def _capped_sdpa(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array, softcap: float) -> mx.array:
    """Attention with Gemma 2's score cap, which MLX's fused SDPA lacks: q (1, H, L, D), k/v (1, Hkv, S, D)."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = mx.repeat(k, g, axis=1), mx.repeat(v, g, axis=1)
    scores = (q.astype(mx.float32) @ k.astype(mx.float32).transpose(0, 1, 3, 2)) * scale
    scores = mx.where(mask, mx.tanh(scores / softcap) * softcap, -mx.inf)
    return (mx.softmax(scores, axis=-1) @ v.astype(mx.float32)).astype(q.dtype)
