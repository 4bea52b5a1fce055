"""Layout `sequence`: per layer [rows, max_seqs + 1, kv_heads, head_dim]; a column per sequence, the last one scratch.

Two attention paths share the storage. On CPU (attention_impl "auto") a per-segment loop planned here in
`prepare_step`: where the CPU library is built, every query row attends alone in it (`native_rows`), so a prompt
computes the same values however its steps cut it; else PyTorch, the reference. On CUDA (or when forced) the kernels of `kernels/`: each layer
runs `kv_write` + `sdpa_varlen` over a `KernelPlan` (device segment table and write slots) that the runner
stages (engine/step_inputs.py) from this layout's `geometry` and hands over with `bind_step`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from engine.cache.base import NATIVE_DTYPES, KVCache, attend_segments, one_row_plan, visible
from engine.cache.config import CacheConfig
from engine.cache.growth import free_bytes
from engine.cache.rings import MIN_ROWS, RingedLayout

ATTENTION_IMPLS = ("auto", "reference", "triton")  # "auto": the loop on CPU, the Triton kernels on CUDA


@dataclass(frozen=True, slots=True)
class SequenceGeometry:
    """What a kernel plan needs to know of the storage: a write slot is storage row * columns + column."""

    columns: int  # max_seqs + 1
    scratch: int  # the padding column
    kinds: tuple[int | None, ...]  # distinct windows (None: global), one slot list each
    rings: tuple[int, ...]  # per kind: ring rows, 0 for flat storage (row = position)
    layer_kinds: tuple[int, ...]  # per layer: the index of its window in `kinds`
    device: torch.device


@dataclass(slots=True)
class KernelPlan:
    """One step's kernel inputs besides the storage: device views of the runner's step buffer, host-int bounds."""

    seq_info: torch.Tensor  # (S, 4) int32: q_start, q_len, column, kv_end
    layer_slots: list[torch.Tensor]  # per layer (T,) int64 flat write slots: row * C + column
    max_q_len: int
    max_kv_len: int


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
        self.free_memory = partial(free_bytes, self.device)  # what a growth may take (tests pass their own)
        self.storage_version = 0  # bumped whenever a K/V tensor is reallocated (captured graphs read them)
        kinds = tuple(sorted(set(windows), key=lambda w: w or 0))
        rings = tuple(self.ring_rows(w) or 0 for w in kinds)
        self.geometry = SequenceGeometry(self.columns, self.scratch, kinds, rings,
                                         tuple(kinds.index(w) for w in windows), self.device)
        self._step: dict = {}  # the loop's plan (CPU)
        self._plan: KernelPlan | None = None  # the kernels' plan, bound by the runner each step

    @property
    def uses_kernels(self) -> bool:
        """Whether attention runs the kernels over a bound `KernelPlan` (else the loop, planned here)."""
        return self.device.type == "cuda" or self.attention_impl != "auto"

    def _alloc(self, rows: int) -> torch.Tensor:
        shape = (rows, self.columns, self.kv_heads, self.head_dim)
        return torch.zeros(shape, dtype=self.config.torch_dtype, device=self.device)

    def _held_rows(self, store: torch.Tensor) -> int:
        return store.shape[0]

    def _regrow(self, old: torch.Tensor, rows: int) -> torch.Tensor:
        with torch.inference_mode(False):  # storage stays a normal tensor: callers may write it outside inference
            new = self._alloc(rows)
            new[: old.shape[0]] = old
        self.storage_version += 1
        return new

    def _row(self, pos: torch.Tensor, window: int | None) -> torch.Tensor:
        ring = self.ring_rows(window)
        return pos if ring is None else pos % ring

    # -- step
    def _prepare(self) -> None:
        self._grow(max((s.start + s.q_len for s in self.segments), default=0))
        if self.uses_kernels:
            self._plan = None  # the runner binds this step's plan
            return
        dev = self.device
        pos = torch.zeros(self.num_tokens, dtype=torch.long)
        col = torch.full((self.num_tokens,), self.scratch, dtype=torch.long)
        for s in self.segments:
            pos[s.q_start : s.q_start + s.q_len] = torch.arange(s.start, s.start + s.q_len)
            col[s.q_start : s.q_start + s.q_len] = s.slot
        plans, native = {}, self.native_rows()
        for w in set(self.windows):
            write = (self._row(pos, w) * self.columns + col).to(dev)
            segments = [self._segment_plan(s, w, rowwise=native or s.rowwise) for s in self.segments]
            plans[w] = (write, segments, one_row_plan(segments, w) if native else None)
        self._step = plans

    def step_plan(self) -> dict:
        """The loop's plan of the prepared step, per window: (write slots, segments, one-row (keys, table) or None)."""
        return self._step

    def set_step_plan(self, plan: dict) -> None:
        """Attends this step with `plan`: the same step's plan held elsewhere (a CPU tape's fixed buffers)."""
        self._step = plan

    def _segment_plan(self, s, window: int | None, rowwise: bool):
        """Gather indices of the keys this segment can see, in position order, and its mask; a rowwise segment has
        no mask: each row attends its own slice of those keys, exactly the keys (and order) a one-token step at its
        position gathers (engine/cache/book.py `attention_segments`)."""
        qpos = torch.arange(s.start, s.start + s.q_len)
        lo = max(0, s.start - window + 1) if window else 0
        kpos = torch.arange(lo, s.start + s.q_len)
        gather = self._row(kpos, window) * self.columns + s.slot
        mask = None if rowwise else visible(kpos, qpos, window).to(self.device)
        return s.q_start, s.q_len, gather.to(self.device), mask

    def bind_step(self, plan: KernelPlan) -> None:
        """The kernels' plan of the step just prepared (engine/step_inputs.py builds it from `geometry`)."""
        self._plan = plan

    def direct_write(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if not self.uses_kernels:  # the loop's plan: a CPU library call may write the cache (kernels/cpu_rope.py)
            native = self.device.type == "cpu" and self.k[layer_id].dtype in NATIVE_DTYPES
            return (self.k[layer_id], self.v[layer_id], self._step[self.windows[layer_id]][0]) if native else None
        p = self._plan
        if p is None:
            return None
        return self.k[layer_id], self.v[layer_id], p.layer_slots[layer_id]

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
               scale: float, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        if self.uses_kernels:
            p = self._plan
            args = (q, k, v, self.k[layer_id], self.v[layer_id], p.seq_info, p.layer_slots[layer_id], scale,
                    p.max_q_len, p.max_kv_len, self.windows[layer_id] or 0, self.attention_impl, softcap, sinks)
            if torch.compiler.is_compiling():  # one opaque op: torch.compile fuses around it
                return torch.ops.parley.sequence_attend(*args)
            return sequence_attend(*args)
        write, segments, rows = self._step[self.windows[layer_id]]
        kf = self.k[layer_id].view(-1, self.kv_heads, self.head_dim)
        vf = self.v[layer_id].view(-1, self.kv_heads, self.head_dim)
        if k is not None:  # None: the caller wrote them (direct_write)
            kf.index_copy_(0, write, k.to(kf.dtype))
            vf.index_copy_(0, write, v.to(vf.dtype))
        return attend_segments(q, kf, vf, segments, rows, self.windows[layer_id], scale, softcap, sinks)

    def _copy_sequence(self, src: int, dst: int) -> None:
        for t in self.k + self.v:
            t[:, dst] = t[:, src]


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
    softcap: float = 0.0,  # 0: scores uncapped
    sinks: torch.Tensor | None = None,  # (H,) fp32: gpt-oss's per-head sink logits
) -> torch.Tensor:  # (T, H, D) in q's dtype
    from kernels import kv_write, sdpa_varlen

    if k is not None:  # None: the caller's kernel already wrote them (direct_write)
        kv_write(k_cache, v_cache, _unit_stride(k), _unit_stride(v), slots, impl=impl)
    out = sdpa_varlen(
        _unit_stride(q.to(k_cache.dtype)), k_cache, v_cache, seq_info, scale=scale, max_q_len=max_q_len,
        max_kv_len=max_kv_len, window=window or None, softcap=softcap, sinks=sinks, impl=impl,
    )
    return out.to(q.dtype).contiguous()


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    """The kernels take any row and head strides (views of a fused QKV) but want a contiguous head dim."""
    return x if x.stride(-1) == 1 else x.contiguous()


@torch.library.custom_op("parley::sequence_attend", mutates_args=("k_cache", "v_cache"))
def _sequence_attend_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    seq_info: torch.Tensor, slots: torch.Tensor, scale: float, max_q_len: int, max_kv_len: int, window: int, impl: str,
    softcap: float, sinks: torch.Tensor | None,
) -> torch.Tensor:
    return sequence_attend(q, k, v, k_cache, v_cache, seq_info, slots, scale, max_q_len, max_kv_len, window, impl,
                           softcap, sinks)


@_sequence_attend_op.register_fake
def _(q, k, v, k_cache, v_cache, seq_info, slots, scale, max_q_len, max_kv_len, window, impl, softcap, sinks):
    return q.new_empty(q.shape)  # contiguous, like the real output
