"""Layout `cell`: one pool of token cells, taken and given back one by one; each sequence holds the list of its cells
in position order, wherever they lie in the pool.

Each segment attends over its own cells gathered in that order, as the `sequence` layout's loop gathers its column
(`attend_segments`): a row's result never depends on where the other sequences' cells lie, so greedy batched == alone
holds on every device (a masked attention over the whole pool summed each row's keys in pool order, which on CUDA
changed a row's bits with its neighbours). Where the CPU library runs the attention (`native_rows`) each query row
attends alone, as the `sequence` layout's rows do: the two layouts then compute the same values."""
from __future__ import annotations

import heapq
from functools import partial

import torch

from engine.cache.base import NATIVE_DTYPES, KVCache, attend_segments, one_row_plan, visible
from engine.cache.config import CacheConfig
from engine.cache.growth import allocation_failed, choose_size, free_bytes, peak_bytes, refusal
from engine.errors import CacheError, CacheMemoryError


class CellKVCache(KVCache):
    """The reference layout: a sequence's cells are scattered over the pool, so each step gathers every key it reads."""

    def __init__(self, config: CacheConfig, windows: list[int | None], kv_heads: int, head_dim: int, device="cpu"):
        super().__init__(config, windows, kv_heads, head_dim, device)
        self.cells = config.initial_capacity
        self._free = list(range(self.cells))
        self._cells_of: dict[int, list[int]] = {}  # slot -> cell of each position, in order
        self.k = [self._alloc(self.cells + 1) for _ in windows]  # +1: scratch cell for padding
        self.v = [self._alloc(self.cells + 1) for _ in windows]
        self.free_memory = partial(free_bytes, self.device)  # what a growth may take (tests pass their own)
        self._step: dict = {}
        self._new_cells: list[tuple[int, list[int]]] = []

    @property
    def pooled(self) -> bool:
        return True

    def _alloc(self, n: int) -> torch.Tensor:
        return torch.zeros((n, self.kv_heads, self.head_dim), dtype=self.config.torch_dtype, device=self.device)

    def seq_clone(self, src: int) -> int:
        self._make_free(len(self._cells_of.get(src, ())))  # a copy the memory cannot hold is refused before its slot
        return super().seq_clone(src)

    def seq_new(self) -> int:
        slot = super().seq_new()
        self._cells_of[slot] = []
        return slot

    # -- cells
    def _take(self, n: int) -> list[int]:
        self._make_free(n)
        return [heapq.heappop(self._free) for _ in range(n)]

    def _make_free(self, n: int) -> None:
        if len(self._free) < n:
            self._grow(self.cells + n - len(self._free))

    def holds(self, end: int, tokens: int) -> bool:
        return tokens <= len(self._free)

    def reserve(self, writes: list[tuple[int, int]]) -> dict[int, CacheMemoryError]:
        """Grows the pool now for a step's (start, tokens) writes; where it finds no memory for them all, the writes
        of the most tokens (of those, the longest conversation's) are refused (by index) until the rest fit."""
        used = self.cells - len(self._free)
        refused, total = {}, min(sum(n for _, n in writes), self.config.capacity - used)  # drafts asked for may not run
        if total <= len(self._free):
            return refused  # every step but a growth's: no sort
        for i in sorted(range(len(writes)), key=lambda i: (-writes[i][1], -sum(writes[i]))):
            try:
                self._make_free(total)
                return refused
            except CacheMemoryError as exc:
                refused[i], total = exc, total - writes[i][1]
        return refused

    def refusal_for(self, start: int, tokens: int) -> CacheMemoryError:
        """The refusal of a conversation that needs `tokens` more from `start`, naming what they would take."""
        cells = min(self.config.capacity, self.cells + max(0, tokens - len(self._free)))
        return refusal(self._growth_bytes(cells), self.free_memory(), self.device)

    def _grow(self, needed: int) -> None:
        if needed > self.config.capacity:
            raise CacheError(f"The KV cache is full ({self.config.capacity:,} tokens).")
        cells = choose_size(self.cells, needed, self.config.capacity, self._growth_bytes, self.free_memory(),
                            self.device, 64)
        cost = self._growth_bytes(cells)
        try:
            with torch.inference_mode(False):  # storage stays a normal tensor: callers may write it outside inference
                for lst in (self.k, self.v):
                    for i, t in enumerate(lst):
                        if t.shape[0] < cells + 1:  # a tensor grown by a growth that failed later is larger already
                            new = self._alloc(cells + 1)
                            new[: self.cells] = t[: self.cells]
                            lst[i] = new
        except Exception as exc:
            if not allocation_failed(exc):
                raise
            raise refusal(cost, None, self.device) from exc  # `cells` and the free list stay as they were
        for c in range(self.cells, cells):
            heapq.heappush(self._free, c)
        self.cells = cells

    def _growth_bytes(self, cells: int) -> int:
        """Bytes growing the pool to `cells` adds at its peak (each layer's K and V replaced in turn)."""
        old = [t.nbytes for t in self.k + self.v]
        per_cell = self.kv_heads * self.head_dim * self.config.torch_dtype.itemsize
        return peak_bytes(old, [max(o, (cells + 1) * per_cell) for o in old])

    def _release(self, cells: list[int]) -> None:
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

    # -- step
    def _prepare(self) -> None:
        self._new_cells = [(s.slot, self._take(s.q_len)) for s in self.segments]  # may grow the pool
        write = torch.full((self.num_tokens,), self.cells, dtype=torch.long)  # padding -> scratch cell
        for s, (_, cells) in zip(self.segments, self._new_cells):
            self._cells_of[s.slot].extend(cells)
            write[s.q_start : s.q_start + s.q_len] = torch.tensor(cells)
        self._step = {"write": write.to(self.device)}
        native = self.native_rows()
        for w in set(self.windows):
            segments = [self._gather(s, w, rowwise=native or s.rowwise) for s in self.segments]
            self._step[w] = segments, one_row_plan(segments, w) if native else None

    def _gather(self, s, window: int | None, rowwise: bool) -> tuple[int, int, torch.Tensor, torch.Tensor | None]:
        """A segment's visible cells in position order and its mask, as the `sequence` layout plans its column (a
        rowwise segment has no mask: each row attends its own slice of those cells, as a one-token step does)."""
        lo = max(0, s.start - window + 1) if window else 0
        cells = torch.tensor(self._cells_of[s.slot][lo : s.start + s.q_len], dtype=torch.long)
        qpos = torch.arange(s.start, s.start + s.q_len)
        mask = None if rowwise else visible(torch.arange(lo, s.start + s.q_len), qpos, window).to(self.device)
        return s.q_start, s.q_len, cells.to(self.device), mask

    def direct_write(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """A CPU library call may write an fp32 or fp16 cache itself (kernels/cpu_rope.py); the GPU's pool is written
        here."""
        if self.device.type != "cpu" or self.k[layer_id].dtype not in NATIVE_DTYPES:
            return None
        return self.k[layer_id], self.v[layer_id], self._step["write"]

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
               scale: float, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        write = self._step["write"]
        if k is not None:  # None: the caller wrote them (direct_write)
            self.k[layer_id].index_copy_(0, write, k.to(self.k[layer_id].dtype))
            self.v[layer_id].index_copy_(0, write, v.to(self.v[layer_id].dtype))
        segments, rows = self._step[self.windows[layer_id]]
        return attend_segments(q, self.k[layer_id], self.v[layer_id], segments, rows, self.windows[layer_id], scale,
                               softcap, sinks)

    def commit_step(self) -> None:
        self._new_cells = []
        super().commit_step()

    def _abort(self) -> None:
        for slot, cells in self._new_cells:
            del self._cells_of[slot][-len(cells):]
            self._release(cells)
        self._new_cells = []

