"""Layout `cell`: one pool of token cells tagged (sequence, position); the mask comes from the tags.

Where the CPU library runs the attention (`native_rows`), each query row attends alone over its sequence's cells in
position order instead, as the `sequence` layout's rows do: the two layouts then compute the same values."""
from __future__ import annotations

import heapq

import torch

from engine.cache.base import KVCache, attend_one_rows, attention, one_row_plan
from engine.cache.config import CacheConfig
from engine.errors import CacheError

FREE = -1


class CellKVCache(KVCache):
    """The reference layout: attention runs over every occupied cell, so its cost grows with the pool."""

    def __init__(self, config: CacheConfig, windows: list[int | None], kv_heads: int, head_dim: int, device="cpu"):
        super().__init__(config, windows, kv_heads, head_dim, device)
        self.cells = config.initial_capacity
        self._free = list(range(self.cells))
        self._cells_of: dict[int, list[int]] = {}  # slot -> cell of each position, in order
        self.tag_seq = torch.full((self.cells + 1,), FREE, dtype=torch.long)  # +1: scratch cell for padding
        self.tag_pos = torch.zeros(self.cells + 1, dtype=torch.long)
        self.k = [self._alloc(self.cells + 1) for _ in windows]
        self.v = [self._alloc(self.cells + 1) for _ in windows]
        self._step: dict = {}
        self._new_cells: list[tuple[int, list[int]]] = []

    def _alloc(self, n: int) -> torch.Tensor:
        return torch.zeros((n, self.kv_heads, self.head_dim), dtype=self.config.torch_dtype, device=self.device)

    def seq_new(self) -> int:
        slot = super().seq_new()
        self._cells_of[slot] = []
        return slot

    # -- cells
    def _take(self, n: int) -> list[int]:
        if len(self._free) < n:
            self._grow(self.cells + n - len(self._free))
        return [heapq.heappop(self._free) for _ in range(n)]

    def _grow(self, needed: int) -> None:
        if needed > self.config.capacity:
            raise CacheError(f"The KV cache is full ({self.config.capacity:,} tokens).")
        cells = self.cells
        while cells < needed:
            cells = min(self.config.capacity, cells * 2)
        with torch.inference_mode(False):  # storage stays a normal tensor: callers may write it outside inference
            for lst in (self.k, self.v):
                for i, t in enumerate(lst):
                    new = self._alloc(cells + 1)
                    new[: self.cells] = t[: self.cells]
                    lst[i] = new
            self.tag_seq = _extend(self.tag_seq, cells + 1, FREE)
            self.tag_pos = _extend(self.tag_pos, cells + 1, 0)
        for c in range(self.cells, cells):
            heapq.heappush(self._free, c)
        self.cells = cells

    def _release(self, cells: list[int]) -> None:
        if cells:
            idx = torch.tensor(cells)
            self.tag_seq[idx] = FREE
            for c in cells:
                heapq.heappush(self._free, c)

    def _drop_from(self, slot: int, pos: int) -> None:
        cells = self._cells_of[slot]
        self._release(cells[pos:])
        del cells[pos:]

    def seq_rm(self, slot: int) -> None:
        super().seq_rm(slot)
        del self._cells_of[slot]

    def _copy_sequence(self, src: int, dst: int) -> None:
        src_cells = self._cells_of[src]
        dst_cells = self._take(len(src_cells))
        self._cells_of[dst] = dst_cells
        if src_cells:
            s, d = torch.tensor(src_cells), torch.tensor(dst_cells)
            for t in self.k + self.v:
                t[d] = t[s]
            self.tag_seq[d] = dst
            self.tag_pos[d] = self.tag_pos[s]

    # -- step
    def _prepare(self) -> None:
        self._new_cells = [(s.slot, self._take(s.q_len)) for s in self.segments]  # may grow the pool
        write = torch.full((self.num_tokens,), self.cells, dtype=torch.long)  # padding -> scratch cell
        q_seq = torch.full((self.num_tokens,), -2, dtype=torch.long)
        q_pos = torch.zeros(self.num_tokens, dtype=torch.long)
        for s, (_, cells) in zip(self.segments, self._new_cells):
            self._cells_of[s.slot].extend(cells)
            rows = slice(s.q_start, s.q_start + s.q_len)
            write[rows] = torch.tensor(cells)
            q_seq[rows], q_pos[rows] = s.slot, torch.arange(s.start, s.start + s.q_len)
            self.tag_seq[write[rows]], self.tag_pos[write[rows]] = s.slot, q_pos[rows]
        self._step = {"write": write.to(self.device)}
        if self.native_rows():
            for w in set(self.windows):
                self._step[w] = one_row_plan([self._gather(s, w) for s in self.segments], w)
            return
        used = max(self._highest_used() + 1, 1)
        for w in set(self.windows):
            self._step[w] = self._mask(q_seq, q_pos, used, w)
        self._step["used"] = used

    def _gather(self, s, window: int | None) -> tuple[int, int, torch.Tensor, None]:
        """A segment's visible cells in position order, as `one_row_plan` takes them (no mask: rows attend alone)."""
        lo = max(0, s.start - window + 1) if window else 0
        return s.q_start, s.q_len, torch.tensor(self._cells_of[s.slot][lo : s.start + s.q_len]), None

    def _highest_used(self) -> int:
        occupied = (self.tag_seq[: self.cells] != FREE).nonzero()
        return int(occupied.max()) if occupied.numel() else 0

    def _mask(self, q_seq: torch.Tensor, q_pos: torch.Tensor, used: int, window: int | None):
        tseq, tpos = self.tag_seq[:used], self.tag_pos[:used]
        mask = (tseq[None, :] == q_seq[:, None]) & (tpos[None, :] <= q_pos[:, None])
        if window:
            mask &= tpos[None, :] > q_pos[:, None] - window
        covered = mask.any(dim=1)
        mask[~covered, 0] = True  # keeps softmax finite; these rows are zeroed after attention
        return mask.to(self.device), covered[:, None, None].to(self.device)

    def direct_write(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """A CPU library call may write an fp32 cache itself (kernels/cpu_rope.py); the GPU's pool is written here."""
        if self.device.type != "cpu" or self.k[layer_id].dtype != torch.float32:
            return None
        return self.k[layer_id], self.v[layer_id], self._step["write"]

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
               scale: float, softcap: float = 0.0) -> torch.Tensor:
        write = self._step["write"]
        if k is not None:  # None: the caller wrote them (direct_write)
            self.k[layer_id].index_copy_(0, write, k.to(self.k[layer_id].dtype))
            self.v[layer_id].index_copy_(0, write, v.to(self.v[layer_id].dtype))
        if "used" not in self._step:  # planned row by row (`native_rows`)
            return attend_one_rows(q, self.k[layer_id], self.v[layer_id], self._step[self.windows[layer_id]], scale,
                                   softcap)
        used = self._step["used"]
        mask, covered = self._step[self.windows[layer_id]]
        keys = self.k[layer_id][:used].to(q.dtype)
        values = self.v[layer_id][:used].to(q.dtype)
        out = attention(q, keys, values, mask, scale, softcap)
        return torch.where(covered, out, torch.zeros((), dtype=out.dtype))

    def commit_step(self) -> None:
        self._new_cells = []
        super().commit_step()

    def _abort(self) -> None:
        for slot, cells in self._new_cells:
            del self._cells_of[slot][-len(cells):]
            self._release(cells)
        self._new_cells = []


def _extend(old: torch.Tensor, n: int, fill: int) -> torch.Tensor:
    new = torch.full((n,), fill, dtype=old.dtype)
    new[: old.shape[0] - 1] = old[:-1]  # the old scratch cell is not carried over
    return new
