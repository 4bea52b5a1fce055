"""Ring sizing and row growth shared by every `sequence`-layout storage (PyTorch and MLX)."""
from __future__ import annotations

from typing import Callable

from engine.cache.growth import allocation_failed, choose_size, peak_bytes, refusal
from engine.errors import CacheMemoryError

MIN_ROWS = 16


class RingedLayout:
    """Sliding-window layers keep rings of window + max_write - 1 rows; global layers grow up to the context, by whole
    rows, inside the memory that is free (`free_memory`; engine/cache/growth.py)."""

    rows: int  # rows currently allocated for global layers
    free_memory: Callable[[], int]  # what a growth may take (tests pass their own)

    def _rings(self) -> dict[int, int]:
        rings = {}
        for w in set(self.windows) - {None}:
            rows = self.config.ring_rows(w)
            if rows < self.config.max_seq_len:  # a ring as long as the context never wraps
                rings[w] = rows
        return rings

    def ring_rows(self, window: int | None) -> int | None:
        return self.book.rings.get(window) if window else None

    def _layer_rows(self, window: int | None, rows: int | None = None) -> int:
        """A layer's rows when global layers hold `rows` (default: the current `rows`)."""
        rows = self.rows if rows is None else rows
        ring = self.ring_rows(window)
        return rows if ring is None else min(rows, ring)

    # -- growth: global layers by whole rows; a ring grows like a flat layer until it reaches its size
    def holds(self, end: int, tokens: int) -> bool:
        return end <= self.rows

    def reserve(self, writes: list[tuple[int, int]]) -> dict[int, CacheMemoryError]:
        """Grows the rows now for a step's (start, tokens) writes, the furthest first; a write whose rows find no memory
        is refused (by index), and the rows are grown for the furthest write that fits."""
        refused = {}
        if max((start + n for start, n in writes), default=0) <= self.rows:
            return refused  # every step but a growth's: no sort
        for i in sorted(range(len(writes)), key=lambda i: -sum(writes[i])):
            try:
                self._grow(sum(writes[i]))
                break  # every other write ends before this one
            except CacheMemoryError as exc:
                refused[i] = exc
        return refused

    def refusal_for(self, start: int, tokens: int) -> CacheMemoryError:
        """The refusal of a conversation that needs `tokens` more from `start`, naming what they would take."""
        return refusal(self._growth_bytes(min(self.config.max_seq_len, start + tokens)), self.free_memory(), self.device)

    def _grow(self, needed: int) -> None:
        if needed <= self.rows:
            return
        rows = choose_size(self.rows, needed, self.config.max_seq_len, self._growth_bytes, self.free_memory(),
                           self.device, MIN_ROWS)
        cost = self._growth_bytes(rows)
        try:
            for i, w in enumerate(self.windows):
                for store in (self.k, self.v):
                    if self._layer_rows(w, rows) > self._held_rows(store[i]):  # a failed growth may have grown it
                        store[i] = self._regrow(store[i], self._layer_rows(w, rows))
        except Exception as exc:
            if not allocation_failed(exc):
                raise
            # `rows` stays: every layer still holds it; the layers already grown keep their larger copies
            raise refusal(cost, None, self.device) from exc
        self.rows = rows

    def _growth_bytes(self, rows: int) -> int:
        """Bytes growing global layers to `rows` adds at its peak (K and V of each layer replaced in turn)."""
        per_row = self.columns * self.kv_heads * self.head_dim * self.config.torch_dtype.itemsize
        layers = [(self._held_rows(t), w) for store in (self.k, self.v) for t, w in zip(store, self.windows)]
        return peak_bytes([n * per_row for n, _ in layers], [max(n, self._layer_rows(w, rows)) * per_row for n, w in layers])

    def _held_rows(self, store) -> int:
        """Rows one layer's K or V storage holds."""
        raise NotImplementedError

    def _regrow(self, old, rows: int):
        """A copy of `old` holding `rows` rows, its own rows first (allocated now: a refusal surfaces here)."""
        raise NotImplementedError
