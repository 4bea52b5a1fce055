"""Layout `sequence`: per layer [rows, max_seqs + 1, kv_heads, head_dim]; a column per sequence, the last one scratch.

Two attention paths share the storage. On CPU (attention_impl "auto") a per-segment PyTorch loop, the
reference. On CUDA (or when forced) the kernels of `kernels/`: `prepare_step` plans a device segment
table `seq_info` and flat write slots as host ints, sends them in one non-blocking copy from pinned
memory, and each layer runs `kv_write` + `sdpa_varlen`. The table's buffers keep their addresses
between steps, so a captured CUDA graph reads each step's table as data.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from engine.cache.base import KVCache, attention, visible
from engine.cache.config import CacheConfig
from engine.cache.rings import RingedLayout

MIN_ROWS = 16
ATTENTION_IMPLS = ("auto", "reference", "triton")  # "auto": the loop on CPU, the Triton kernels on CUDA
MIN_KV_BUCKET = 256  # max_kv_len is planned in powers of two from here, so graphs and kernels are reused


def pow2_bucket(n: int, least: int = 1) -> int:
    return 1 << (max(n, least) - 1).bit_length()


@dataclass(slots=True)
class KernelPlan:
    """One step's kernel inputs: device views of the step buffer plus host-int bounds."""

    seq_info: torch.Tensor  # (S, 4) int32: q_start, q_len, column, kv_end
    layer_slots: list[torch.Tensor]  # per layer (T,) int64 flat write slots: row * C + column
    max_q_len: int
    max_kv_len: int
    positions: torch.Tensor  # (T,) int64: each row's position (0 on padding rows)
    tokens: torch.Tensor  # (T,) int64: the ids given to prepare_step, else what the buffer held


class SequenceKVCache(RingedLayout, KVCache):
    def __init__(
        self,
        config: CacheConfig,
        windows: list[int | None],
        kv_heads: int,
        head_dim: int,
        device="cpu",
        attention_impl: str = "auto",
    ):
        super().__init__(config, windows, kv_heads, head_dim, device)
        if attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, not {attention_impl!r}")
        self.attention_impl = attention_impl
        self.columns = config.max_seqs + 1
        self.scratch = config.max_seqs
        self.rows = max(MIN_ROWS, -(-config.initial_capacity // config.max_seqs))
        self.rows = min(self.rows, config.max_seq_len)
        self.k = [self._alloc(self._layer_rows(w)) for w in windows]
        self.v = [self._alloc(self._layer_rows(w)) for w in windows]
        self.storage_version = 0  # bumped whenever a tensor a captured graph reads is reallocated
        self.plan: KernelPlan | None = None
        self._step: dict = {}
        self._kinds = sorted(set(windows), key=lambda w: w or 0)  # distinct windows: one slot list each
        self._buffers: _StepBuffers | None = None
        self._pad_segments = 0
        self._tokens: torch.Tensor | None = None
        self._step_key: tuple | None = None

    @property
    def uses_kernels(self) -> bool:
        return self.device.type == "cuda" or self.attention_impl != "auto"


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
                self.storage_version += 1

    def reserve(self, tokens: int) -> None:
        """Allocates every layer for `tokens` per sequence now, so decode graphs never see a regrow."""
        self._grow(min(tokens, self.config.max_seq_len))

    def _regrow(self, old: torch.Tensor, rows: int) -> torch.Tensor:
        with torch.inference_mode(False):  # storage stays a normal tensor: callers may write it outside inference
            new = self._alloc(rows)
            new[: old.shape[0]] = old
        return new

    def _row(self, pos: torch.Tensor, window: int | None) -> torch.Tensor:
        ring = self.ring_rows(window)
        return pos if ring is None else pos % ring

    # -- step
    @torch.inference_mode()
    def prepare_step(self, num_tokens: int | None = None, num_segments: int | None = None,
                     tokens: torch.Tensor | None = None) -> None:
        """As KVCache.prepare_step; `num_segments` pads the segment table with empty segments (graphs).
        With the kernels, `tokens` (host ids of the used rows) travel in the same upload as the table and
        land in `plan.tokens`; without them that part of the buffer is left as it is on the device (a
        replayed graph's greedy ids, for the step after it)."""
        self._pad_segments = num_segments or 0
        self._tokens = tokens
        super().prepare_step(num_tokens)

    def _prepare(self) -> None:
        self._grow(max((s.start + s.q_len for s in self.segments), default=0))
        if self.uses_kernels:
            self._plan_kernels()
            return
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

    def _plan_kernels(self) -> None:
        """Host ints -> one pinned buffer -> one non-blocking copy; the plan holds device views of it. The copy
        leaves out what the device holds already: the ids of a look-ahead step, and the table of a decode step
        that the previous replayed graph moved on to (kernels/step_advance.py)."""
        T, segs = self.num_tokens, self.segments
        S = max(len(segs), self._pad_segments)
        bufs = self._buffers
        if bufs is None or not bufs.fits(T, S):
            rings = [self.ring_rows(w) or 0 for w in self._kinds]
            self._buffers = bufs = _StepBuffers(len(self._kinds), max(T, 512), max(S, 64), rings, self.device)
            self.storage_version += 1
        n, off = bufs.tokens, bufs.table_offset
        key = (self.storage_version, T, S, tuple((s.q_start, s.q_len, s.slot, s.start) for s in segs))
        table = bufs.table_key != key
        if table or self._tokens is not None:
            host = bufs.host_for_write()
            if self._tokens is not None:
                ids = self._tokens.tolist()
                host[: len(ids)] = ids
            if table:
                self._write_table(host, bufs, T, S)
                bufs.table_key = key
            bufs.send(0 if self._tokens is not None else n, off + 2 * S if table else T)
        self._step_key = key
        dev = bufs.device
        seq_info = dev[off : off + 2 * S].view(torch.int32).view(S, 4)
        kind_slots = [dev[(i + 2) * n : (i + 2) * n + T] for i in range(len(self._kinds))]
        self.plan = KernelPlan(
            seq_info=seq_info,
            layer_slots=[kind_slots[self._kinds.index(w)] for w in self.windows],
            max_q_len=pow2_bucket(max((s.q_len for s in segs), default=1)),
            max_kv_len=pow2_bucket(max((s.start + s.q_len for s in segs), default=1), MIN_KV_BUCKET),
            positions=dev[bufs.positions_offset : bufs.positions_offset + T],
            tokens=dev[:T],
        )

    def _write_table(self, host, bufs: "_StepBuffers", T: int, S: int) -> None:
        """Positions, per window kind the flat write slots, and the segment table, into the staging buffer."""
        segs, n = self.segments, bufs.tokens
        positions = [0] * T  # padding rows: position 0 of the scratch column
        for s in segs:
            positions[s.q_start : s.q_start + s.q_len] = range(s.start, s.start + s.q_len)
        host[bufs.positions_offset : bufs.positions_offset + T] = positions
        C = self.columns
        for i, w in enumerate(self._kinds):
            ring = self.ring_rows(w)
            slots = [self.scratch] * T  # padding rows write row 0 of the scratch column
            for s in segs:
                for j in range(s.q_len):
                    p = s.start + j
                    slots[s.q_start + j] = (p % ring if ring else p) * C + s.slot
            host[(i + 2) * n : (i + 2) * n + T] = slots
        # the table is int32 (q_start, q_len, column, kv_end), packed two to an int64 (little endian)
        table = [s.q_start | (s.q_len << 32) for s in segs], [s.slot | ((s.start + s.q_len) << 32) for s in segs]
        pad = [0, self.scratch] * (S - len(segs))
        off = bufs.table_offset
        host[off : off + 2 * S] = [x for pair in zip(*table) for x in pair] + pad

    def step_advance(self, host_ids: torch.Tensor):
        """What a decode graph's argmax moves on after this step (kernels/step_advance.py), with the ids going
        to `host_ids`; call `advanced` once it has run. None where the kernels do not run."""
        from kernels.step_advance import StepAdvance

        bufs, plan = self._buffers, self.plan
        if plan is None or not self.uses_kernels:
            return None
        n, kinds = bufs.tokens, len(self._kinds)
        slots = bufs.device[2 * n : (2 + kinds) * n].view(kinds, n)
        return StepAdvance(host_ids, plan.seq_info, plan.positions, slots, bufs.rings, self.columns)

    @contextlib.contextmanager
    def step_buffer_kept(self):
        """For kernels run outside the engine's order (a graph's warm-up, a profile): what they write into the
        step buffer (greedy ids, the advanced table) is put back afterwards."""
        with torch.inference_mode():  # the buffer is an inference tensor
            saved = self._buffers.device.clone()
        try:
            yield
        finally:
            with torch.inference_mode():
                self._buffers.device.copy_(saved)

    def advanced(self) -> None:
        """The step just queued ran `step_advance`: the device now holds the table of the same sequences'
        next decode step, one token on (and the next prepare_step sends none)."""
        version, T, S, segs = self._step_key
        if all(q_len == 1 and q_start == i for i, (q_start, q_len, _, _) in enumerate(segs)):
            self._buffers.table_key = (version, T, S, tuple((i, 1, slot, start + 1) for i, (_, _, slot, start)
                                                            in enumerate(segs)))
        else:  # the kernel moves on only rows that are their own segment: nothing to rely on
            self._buffers.table_key = None

    def direct_write(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if not self.uses_kernels or self.plan is None:
            return None
        return self.k[layer_id], self.v[layer_id], self.plan.layer_slots[layer_id]

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
               scale: float) -> torch.Tensor:
        if self.uses_kernels:
            p = self.plan
            args = (q, k, v, self.k[layer_id], self.v[layer_id], p.seq_info, p.layer_slots[layer_id], scale,
                    p.max_q_len, p.max_kv_len, self.windows[layer_id] or 0, self.attention_impl)
            if torch.compiler.is_compiling():  # one opaque op: torch.compile fuses around it
                return torch.ops.parley.sequence_attend(*args)
            return sequence_attend(*args)
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
        self.table_key = None  # (storage version, T, S, segments) of the table the device holds, if known
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


def sequence_attend(
    q: torch.Tensor,  # (T, H, D)
    k: torch.Tensor | None,  # (T, Hkv, D)
    v: torch.Tensor | None,
    k_cache: torch.Tensor,  # (rows, C, Hkv, D)
    v_cache: torch.Tensor,
    seq_info: torch.Tensor,  # (S, 4) int32
    slots: torch.Tensor,  # (T,) int64
    scale: float,
    max_q_len: int,
    max_kv_len: int,
    window: int,  # 0: global
    impl: str,
) -> torch.Tensor:  # (T, H, D) in q's dtype
    from kernels import kv_write, sdpa_varlen

    if k is not None:  # None: the caller's kernel already wrote them (direct_write)
        kv_write(k_cache, v_cache, _unit_stride(k), _unit_stride(v), slots, impl=impl)
    out = sdpa_varlen(
        _unit_stride(q.to(k_cache.dtype)), k_cache, v_cache, seq_info, scale=scale, max_q_len=max_q_len,
        max_kv_len=max_kv_len, window=window or None, impl=impl,
    )
    return out.to(q.dtype).contiguous()


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    """The kernels take any row and head strides (views of a fused QKV) but want a contiguous head dim."""
    return x if x.stride(-1) == 1 else x.contiguous()


@torch.library.custom_op("parley::sequence_attend", mutates_args=("k_cache", "v_cache"))
def _sequence_attend_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    seq_info: torch.Tensor, slots: torch.Tensor, scale: float, max_q_len: int, max_kv_len: int, window: int, impl: str,
) -> torch.Tensor:
    return sequence_attend(q, k, v, k_cache, v_cache, seq_info, slots, scale, max_q_len, max_kv_len, window, impl)


@_sequence_attend_op.register_fake
def _(q, k, v, k_cache, v_cache, seq_info, slots, scale, max_q_len, max_kv_len, window, impl):
    return q.new_empty(q.shape)  # contiguous, like the real output
