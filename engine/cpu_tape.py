"""CPU decode tapes: a decode step's library calls, recorded once per row count and replayed (the CPU's CUDA graphs).

On Parley's CPU kernels (weights in the blocks format, an fp32 `sequence` cache), every op of a decode step from the
embedded rows to the logits is a call into the library (kernels/cpu_native.py): the products, norms, the attention
prologue and one-row attention, the MLP activation. Their Python and torch dispatch cost a quarter of a step of the
embedded model. A tape notes those calls (function and arguments) the first time a decode step of R rows runs, over
inputs held at fixed addresses (the embedded rows, rotary tables and the cache's plan, copied in each step), and
replays them after: no Python per layer.

Verify steps (drafted tokens, engine/speculative) are taped too: their rows attend one by one, as decode rows do.

Recording is checked, never assumed: the step runs under a dispatch mode that sees every torch op; any op that
computes (rather than allocating or viewing) means the forward did work a replay would skip, and this model takes no
tapes (its steps stay eager). The tensors the step allocated move into one arena all tapes share (a replay writes
each before reading it), so no argument points at freed memory and every width up to MAX_ROWS stays taped; a K/V
storage that moved (regrown) or another thread count drops the tapes.

A replay makes exactly the calls of an eager step, in order, on the same rows: greedy output is bit-identical
(tests/engine/test_cpu_tape.py), and batched == alone holds as it does eagerly.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.cache import SequenceKVCache
from engine.models.layers import CausalLM, RopeInputs
from engine.models.moe import SparseMoE
from engine.step import StepBatch
from kernels import cpu_native

MAX_ROWS = 16  # decode steps of up to this many rows get a tape each (beyond, the products dwarf the Python)
ALIGN = 64  # bytes: each of a tape's tensors starts on a cache line of the arena, as torch's own allocations do
# with this many sequences or more, a verify step's rows a multiple of it (the longest drafts' last tokens trimmed,
# the least likely kept). It kept 8 sessions' widths within the tapes' old bound; with every width taped, trimming
# still measured no worse (8 sessions: code_edit 1.72x / 1.73x untrimmed, summarise 1.43x / 1.39x, open chat
# 0.96x / 0.95x)
ROW_STEP = 4
# ops that only allocate or view: a step whose recording runs nothing else has all of its work in the library
_FREE_OPS = frozenset({
    "empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "view", "_unsafe_view", "reshape",
    "split", "split_with_sizes", "chunk", "slice", "select", "alias", "as_strided", "t", "transpose", "permute",
    "unsqueeze", "squeeze", "expand", "narrow", "detach", "unbind",
})


class _Watch(TorchDispatchMode):
    """Notes the torch ops run inside it that compute, and keeps every tensor they allocate alive."""

    def __init__(self):
        super().__init__()
        self.computed: list[str] = []
        self.allocated: list[torch.Tensor] = []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # never under torch.compile; skipping it wraps our dispatch in torch's compiler, which the first tape would
        # then import (~2 s, ~130 MB resident)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if args and out is args[0]:  # a conversion to what the tensor already is (`to`, `contiguous`): no work
            return out
        if name not in _FREE_OPS:
            self.computed.append(name)
        elif name.startswith(("empty", "new_empty")):
            self.allocated.append(out)
        return out


@dataclass(frozen=True, slots=True)
class _At:
    """A recorded call's argument that pointed into a tensor its step allocated: that byte's offset in the arena."""

    offset: int


@dataclass(frozen=True, slots=True)
class _Placed:
    """A tensor the step allocated, as a view of the arena: where it starts (bytes), its dtype, shape and strides."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


class _Arena:
    """The memory of every tape's own tensors (activations, norms, scratch), laid end to end. Tapes replay one at a
    time and a step's calls write each such tensor before they read it, so every tape shares the widest one's memory.
    Each tape held its own before (0.98 MB a row on Gemma 3 270M), which bounded the tapes kept: two sessions drafting
    (widths 2 to 17) recorded their widths again and again (summarise's two-session tail: 17 of 47 steps, ~17 ms
    each)."""

    def __init__(self) -> None:
        self.memory = torch.empty(0, dtype=torch.uint8)

    def grow(self, nbytes: int) -> bool:
        """Holds at least `nbytes`; whether it moved (the tapes bound to it bind again)."""
        if nbytes <= self.memory.numel():
            return False
        self.memory = torch.empty(nbytes, dtype=torch.uint8)
        return True

    def view(self, placed: _Placed) -> torch.Tensor:
        size = placed.dtype.itemsize
        return torch.empty(0, dtype=placed.dtype).set_(self.memory.untyped_storage(), placed.offset // size,
                                                       placed.shape, placed.stride)


class _Tape:
    """One row count's recorded step: its calls (pointers into the arena as offsets), fixed inputs and outputs."""

    def __init__(self, plan: list[cpu_native.Call], size: int, inputs: dict, logits: torch.Tensor | _Placed,
                 key: tuple, taps: tuple[torch.Tensor | _Placed, ...] | None, arena: _Arena):
        self.plan, self.size, self.inputs = plan, size, inputs  # size: the arena bytes its tensors take
        self.key = key  # `_key` when recorded: the K/V storage's addresses and the thread count
        self._logits, self._taps = logits, taps
        self.bind(arena)

    def bind(self, arena: _Arena) -> None:
        """The calls as made, and the outputs as tensors, at the arena's address."""
        base = arena.memory.data_ptr()
        self.calls = [(fn, tuple(base + a.offset if type(a) is _At else a for a in args)) for fn, args in self.plan]
        self.logits = _placed(self._logits, arena)
        # the model's tap outputs (CausalLM.last_taps): buffers the replayed calls write again
        self.taps = None if self._taps is None else tuple(_placed(t, arena) for t in self._taps)

    def replay(self) -> torch.Tensor:
        for fn, args in self.calls:
            if fn(*args):  # the library's functions return 0 (or nothing) on success, -1 without scratch memory
                raise MemoryError("the CPU kernels could not allocate their scratch memory")
        return self.logits


class DecodeTapes:
    """Records and replays decode steps of one model on one `sequence` cache (see the module's note)."""

    def __init__(self, model: CausalLM, cache: SequenceKVCache):
        self.model, self.cache = model, cache
        self.tapes: dict[int, _Tape] = {}  # by row count: at most MAX_ROWS, all kept (their memory is the arena's)
        self.arena = _Arena()
        self.refused: str | None = None  # why this model takes no tapes: the first computing op seen recording
        self.logits: torch.Tensor | None = None  # (MAX_ROWS, vocab): the tapes' logits, a step's valid until the next

    @staticmethod
    def width(running: int, rows: int) -> int:
        """The rows a step of `running` sequences with drafts, `rows` in all, should take: a multiple of ROW_STEP (not
        under `running`) where several sequences decode and a tape takes the step; else `rows`."""
        if running < ROW_STEP or rows > MAX_ROWS:
            return rows
        return max(running, rows - rows % ROW_STEP)

    @staticmethod
    def fits(model: CausalLM, cache) -> bool:
        """Whether a model and cache can run taped steps: an fp32 `sequence` cache on the CPU library, one-row
        attention in it, and a model on the library's ops (`native`, set by `CausalLM.prepare`); a mixture of experts
        only where each of its layers is one library call (routing as data: `SparseMoE.tapeable`)."""
        return (isinstance(cache, SequenceKVCache) and not cache.uses_kernels and cache.native_rows()
                and any(getattr(m, "native", False) for m in model.modules())
                and all(m.tapeable for m in model.modules() if isinstance(m, SparseMoE)))

    def accepts(self, batch: StepBatch) -> bool:
        """A step of at most MAX_ROWS rows, every one a one-row query and sampled, in order: decode rows, and verify
        rows (a rowwise segment attends row by row, exactly as decode rows do, so the same tape serves both)."""
        t = len(batch.tokens)
        return (self.refused is None and 0 < t <= MAX_ROWS and len(batch.logit_rows) == t
                and batch.device_tokens is None and all(s.q_len == 1 or s.rowwise for s in batch.segments)
                and batch.logit_rows.tolist() == list(range(t)))

    @torch.inference_mode()
    def run(self, batch: StepBatch) -> torch.Tensor:
        """The step's logits (R, V) fp32: a view of the tape's output, valid until the next step of R rows."""
        cache, model = self.cache, self.model
        cache.prepare_step()  # may regrow the storage: tapes recorded over the old one go
        t, key = len(batch.tokens), _key(cache) + (model.tap_layers,)
        tape = self.tapes.get(t)
        if tape is not None and tape.key != key:
            self.tapes.clear()
            tape = None
        h, _ = model.embed(batch.tokens)  # the first norm comes fused with it only on CUDA
        ropes = model.rope_inputs(batch.positions, h.dtype)
        if tape is not None:
            _fill(tape.inputs, h, ropes, cache)
            model.last_taps = tape.taps
            return tape.replay()
        return self._record(t, h, ropes)

    def _record(self, t: int, h: torch.Tensor, ropes: dict) -> torch.Tensor:
        cache, model = self.cache, self.model
        model.last_taps = None
        inputs = _static_inputs(t, h, ropes, cache)
        _fill(inputs, h, ropes, cache)
        cache.set_step_plan(inputs["plan"])
        ropes = {kind: RopeInputs(r.rotary, r.positions, r.dtype, inputs["tables"][kind]) for kind, r in ropes.items()}
        calls: list[cpu_native.Call] = []
        with _Watch() as watch, cpu_native.recording(calls):
            logits = model.forward_hidden(inputs["h"], None, ropes, cache, None)
        if watch.computed:
            self.refused = watch.computed[0]
            self.tapes.clear()
            return logits
        calls, keep, out = self._shared(calls, watch.allocated, logits)
        plan, size, (out, *taps) = _relocate(calls, keep, (out, *(model.last_taps or ())))
        if self.arena.grow(size):
            for tape in self.tapes.values():
                tape.bind(self.arena)
        self.tapes[t] = _Tape(plan, size, inputs, out, _key(cache) + (model.tap_layers,),
                              None if model.last_taps is None else tuple(taps), self.arena)
        return logits

    def _shared(self, calls: list[cpu_native.Call], keep: list[torch.Tensor],
                logits: torch.Tensor) -> tuple[list[cpu_native.Call], list[torch.Tensor], torch.Tensor]:
        """The calls writing the step's logits into the first rows of the buffer every tape shares, and what the tape
        keeps without its own logits; as recorded where a call points into the logits other than at their start."""
        start, size = logits.data_ptr(), logits.numel() * logits.element_size()
        whole = logits.dim() == 2 and logits.is_contiguous() and logits.untyped_storage().nbytes() == size
        if not whole or any(isinstance(a, int) and start < a < start + size for _, args in calls for a in args):
            return calls, keep, logits
        if self.logits is None:
            self.logits = torch.empty(MAX_ROWS, *logits.shape[1:], dtype=logits.dtype)
        if self.logits.shape[1:] != logits.shape[1:] or self.logits.dtype != logits.dtype:
            return calls, keep, logits
        shared = self.logits.data_ptr()
        calls = [(fn, tuple(shared if isinstance(a, int) and a == start else a for a in args)) for fn, args in calls]
        return calls, [k for k in keep if k.data_ptr() != start], self.logits[:logits.shape[0]]


def _relocate(calls: list[cpu_native.Call], allocated: list[torch.Tensor], outputs: tuple[torch.Tensor, ...]
              ) -> tuple[list[cpu_native.Call], int, list[torch.Tensor | _Placed]]:
    """The recorded step moved into an arena that lays the tensors it allocated end to end: the calls with each
    pointer into one of them as an `_At`, the arena's bytes they need, and `outputs` as `_Placed` where they live
    there (else as they are: the shared logits)."""
    regions: dict[int, tuple[int, int]] = {}  # a storage's address -> (its offset in the arena, its bytes)
    size = 0
    for tensor in allocated:
        storage = tensor.untyped_storage()
        start, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes and start not in regions:
            regions[start] = (size, nbytes)
            size += -(-nbytes // ALIGN) * ALIGN
    starts = sorted(regions)

    def moved(a):
        if type(a) is not int:  # pointers are ints (`data_ptr()`); bools, floats, None and ctypes arrays stay
            return a
        i = bisect_right(starts, a) - 1
        if i < 0 or a >= starts[i] + regions[starts[i]][1]:
            return a
        return _At(regions[starts[i]][0] + a - starts[i])

    plan = [(fn, tuple(moved(a) for a in args)) for fn, args in calls]
    placed = []
    for tensor in outputs:
        region = regions.get(tensor.untyped_storage().data_ptr())
        placed.append(tensor if region is None else _Placed(region[0] + tensor.storage_offset() * tensor.element_size(),
                                                            tensor.dtype, tuple(tensor.shape), tuple(tensor.stride())))
    return plan, size, placed


def _placed(tensor: torch.Tensor | _Placed, arena: _Arena) -> torch.Tensor:
    return arena.view(tensor) if isinstance(tensor, _Placed) else tensor


def _key(cache: SequenceKVCache) -> tuple:
    """What a tape's calls assume besides their own buffers: where the K/V storage is, how many threads multiply."""
    return (torch.get_num_threads(), *(t.data_ptr() for t in cache.k), *(t.data_ptr() for t in cache.v))


def _static_inputs(t: int, h: torch.Tensor, ropes: dict, cache: SequenceKVCache) -> dict:
    """Buffers at fixed addresses for what changes from step to step: the embedded rows, each rotary kind's tables,
    and per window the cache's write slots, key list (room for every row's longest view) and one-row table."""
    plan = {}
    for window, (write, segments, rows) in cache.step_plan().items():
        keys, table = rows
        room = t * min(window or cache.config.max_seq_len, cache.config.max_seq_len)
        plan[window] = (torch.empty_like(write), segments, (torch.empty(room, dtype=keys.dtype),
                                                            torch.empty_like(table)))
    tables = {kind: tuple(torch.empty_like(x) for x in rope.tables()) for kind, rope in ropes.items()}
    return {"h": torch.empty_like(h), "tables": tables, "plan": plan}


def _fill(inputs: dict, h: torch.Tensor, ropes: dict, cache: SequenceKVCache) -> None:
    """Copies this step's inputs into the tape's buffers."""
    inputs["h"].copy_(h)
    for kind, rope in ropes.items():
        for static, x in zip(inputs["tables"][kind], rope.tables()):
            static.copy_(x)
    for window, (write, _, rows) in cache.step_plan().items():
        s_write, _, (s_keys, s_table) = inputs["plan"][window]
        s_write.copy_(write)
        s_keys[: rows[0].shape[0]].copy_(rows[0])
        s_table.copy_(rows[1])
