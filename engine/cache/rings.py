"""Ring sizing shared by every `sequence`-layout storage (PyTorch and MLX)."""
from __future__ import annotations


class RingedLayout:
    """Sliding-window layers keep rings of window + max_write - 1 rows; global layers grow up to the context."""

    rows: int  # rows currently allocated for global layers

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
