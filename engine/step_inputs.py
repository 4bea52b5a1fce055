"""StepInputs: the runner's inputs of a step on the kernels, staged on the host and sent in one copy.

Token ids, positions, per window kind the flat write slots, then the segment table: host ints written into
pinned staging memory and sent in one non-blocking copy to a device buffer whose addresses do not move
between steps, so a captured CUDA graph reads each step's inputs as data. The copy leaves out what the
device holds already: the ids of a look-ahead step, and the table of a decode step that the previous
replayed graph moved on to (kernels/step_advance.py). The cache gives its geometry and takes the plan
(`SequenceKVCache.bind_step`); it keeps storage, bookkeeping and `attend`.
"""
from __future__ import annotations

import contextlib

import torch

from engine.cache.book import attention_segments
from engine.cache.sequence_layout import KernelPlan, SequenceGeometry, SequenceKVCache

MIN_KV_BUCKET = 256  # max_kv_len is planned in powers of two from here, so graphs and kernels are reused


def pow2_bucket(n: int, least: int = 1) -> int:
    return 1 << (max(n, least) - 1).bit_length()


class StepInputs:
    """Owns the step buffer of one `sequence`-layout cache on the kernels; `prepare` once per step."""

    def __init__(self, cache: SequenceKVCache):
        self.cache = cache
        self.geometry: SequenceGeometry = cache.geometry
        self.version = 0  # bumped when a tensor captured graphs read is reallocated: this buffer or the K/V storage
        self.plan: KernelPlan | None = None
        self.tokens: torch.Tensor | None = None  # (T,) int64 device view: the step's ids (a graph's argmax writes here)
        self.positions: torch.Tensor | None = None  # (T,) int64 device view: each row's position (0 on padding)
        self._buffers: _StepBuffers | None = None
        self._storage_version = cache.storage_version
        self._key: tuple | None = None  # (version, T, S, segments) of the step last prepared

    @torch.inference_mode()
    def prepare(self, num_tokens: int | None = None, num_segments: int | None = None,
                tokens: torch.Tensor | None = None) -> KernelPlan:
        """Prepares the cache's declared step (as `KVCache.prepare_step`), sends its inputs and binds its plan.
        `num_segments` pads the segment table with empty segments (graphs). `tokens` (host ids of the used rows)
        travel in the same upload and land in `self.tokens`; without them that part of the buffer is left as it
        is on the device (a replayed graph's greedy ids, for the step after it)."""
        cache = self.cache
        cache.prepare_step(num_tokens)  # may grow the storage: a new storage version
        T, segs = cache.num_tokens, attention_segments(cache.segments)
        S = max(len(segs), num_segments or 0)
        bufs = self._buffers
        if bufs is None or not bufs.fits(T, S):
            g = self.geometry
            self._buffers = bufs = _StepBuffers(len(g.kinds), max(T, 512), max(S, 64), list(g.rings), g.device)
            self.version += 1
        if cache.storage_version != self._storage_version:
            self._storage_version = cache.storage_version
            self.version += 1
        n, off = bufs.tokens, bufs.table_offset
        key = (self.version, T, S, tuple((s.q_start, s.q_len, s.slot, s.start) for s in segs))
        table = bufs.table_key != key
        if table or tokens is not None:
            host = bufs.host_for_write()
            if tokens is not None:
                ids = tokens.tolist()
                host[: len(ids)] = ids
            if table:
                self._write_table(host, bufs, T, S)
                bufs.table_key = key
            bufs.send(0 if tokens is not None else n, off + 2 * S if table else T)
        self._key = key
        dev = bufs.device
        kind_slots = [dev[(i + 2) * n : (i + 2) * n + T] for i in range(len(self.geometry.kinds))]
        self.plan = plan = KernelPlan(
            seq_info=dev[off : off + 2 * S].view(torch.int32).view(S, 4),
            layer_slots=[kind_slots[k] for k in self.geometry.layer_kinds],
            max_q_len=pow2_bucket(max((s.q_len for s in segs), default=1)),
            max_kv_len=pow2_bucket(max((s.start + s.q_len for s in segs), default=1), MIN_KV_BUCKET),
        )
        self.tokens, self.positions = dev[:T], dev[bufs.positions_offset : bufs.positions_offset + T]
        cache.bind_step(plan)
        return plan

    def _write_table(self, host, bufs: "_StepBuffers", T: int, S: int) -> None:
        """Positions, per window kind the flat write slots, and the segment table, into the staging buffer."""
        segs, n, g = attention_segments(self.cache.segments), bufs.tokens, self.geometry
        positions = [0] * T  # padding rows: position 0 of the scratch column
        for s in segs:
            positions[s.q_start : s.q_start + s.q_len] = range(s.start, s.start + s.q_len)
        host[bufs.positions_offset : bufs.positions_offset + T] = positions
        C = g.columns
        for i, ring in enumerate(g.rings):
            slots = [g.scratch] * T  # padding rows write row 0 of the scratch column
            for s in segs:
                for j in range(s.q_len):
                    p = s.start + j
                    slots[s.q_start + j] = (p % ring if ring else p) * C + s.slot
            host[(i + 2) * n : (i + 2) * n + T] = slots
        # the table is int32 (q_start, q_len, column, kv_end), packed two to an int64 (little endian)
        table = [s.q_start | (s.q_len << 32) for s in segs], [s.slot | ((s.start + s.q_len) << 32) for s in segs]
        pad = [0, g.scratch] * (S - len(segs))
        off = bufs.table_offset
        host[off : off + 2 * S] = [x for pair in zip(*table) for x in pair] + pad

    def step_advance(self, host_ids: torch.Tensor):
        """What a decode graph's argmax moves on after the step just prepared (kernels/step_advance.py), with
        the ids going to `host_ids`; call `advanced` once it has run."""
        from kernels.step_advance import StepAdvance

        bufs, kinds = self._buffers, len(self.geometry.kinds)
        n = bufs.tokens
        slots = bufs.device[2 * n : (2 + kinds) * n].view(kinds, n)
        return StepAdvance(host_ids, self.plan.seq_info, self.positions, slots, bufs.rings, self.geometry.columns)

    def advanced(self) -> None:
        """The step just queued ran `step_advance`: the device now holds the table of the same sequences'
        next decode step, one token on (and the next `prepare` sends none)."""
        version, T, S, segs = self._key
        if all(q_len == 1 and q_start == i for i, (q_start, q_len, _, _) in enumerate(segs)):
            self._buffers.table_key = (version, T, S, tuple((i, 1, slot, start + 1) for i, (_, _, slot, start)
                                                            in enumerate(segs)))
        else:  # the kernel moves on only rows that are their own segment: nothing to rely on
            self._buffers.table_key = None

    @contextlib.contextmanager
    def kept(self):
        """For kernels run outside the engine's order (a graph's warm-up, a profile): what they write into the
        step buffer (greedy ids, the advanced table) is put back afterwards."""
        with torch.inference_mode():  # the buffer is an inference tensor
            saved = self._buffers.device.clone()
        try:
            yield
        finally:
            with torch.inference_mode():
                self._buffers.device.copy_(saved)


class _StepBuffers:
    """Pinned host staging and its device twin, int64, `tokens` rows per section: the step's token ids, their
    positions, per window kind the flat write slots, then the segment table."""

    def __init__(self, kinds: int, tokens: int, segments: int, rings: list[int], device: torch.device):
        self.tokens, self.segments = tokens, segments
        self.positions_offset = tokens
        self.table_offset = (kinds + 2) * tokens
        n = self.table_offset + 2 * segments
        pin = device.type == "cuda"
        self._host = torch.zeros(n, dtype=torch.int64, pin_memory=pin)
        self._host_np = self._host.numpy()
        self.device = torch.zeros(n, dtype=torch.int64, device=device)
        self.rings = torch.tensor(rings, dtype=torch.int64, device=device)  # per window kind, 0: flat storage
        self.table_key = None  # (version, T, S, segments) of the table the device holds, if known
        self._sent = torch.cuda.Event() if pin else None

    def fits(self, tokens: int, segments: int) -> bool:
        return tokens <= self.tokens and segments <= self.segments

    def host_for_write(self):
        if self._sent is not None:
            self._sent.synchronize()  # the previous step's copy must have left the staging buffer
        return self._host_np

    def send(self, lo: int, hi: int) -> torch.Tensor:
        """Copies [lo, hi) of the staging buffer to the device (one copy); returns the whole device buffer."""
        self.device[lo:hi].copy_(self._host[lo:hi], non_blocking=True)
        if self._sent is not None:
            self._sent.record()
        return self.device
