"""SamplingGraphs: a sampled step's penalties, candidates and draw replayed from one CUDA graph.

Drawn one launch at a time, a sampled step of the app's defaults cost the host ~0.5 ms after the decode graph (H200,
270M shape: 0.45x greedy): three small host-to-device copies, the penalty kernels, topk, the draw kernel and the
penalties taken back, each launched from Python. Here a step's host inputs (each row's draw parameters and uniform,
its penalties and its penalised history) are written into pinned staging memory and sent in one copy to a device
buffer a captured graph reads as data; the graph runs the same kernels in the same order as
`sampling._penalties` + `sampling._gpu_draw`, so a row draws the same token either way (tested).

A graph is kept per (logits' address, rows, vocabulary, candidates, history width, frequency, pending token) and
captured the second time its key comes (a one-off step draws eagerly). Steps it does not cover (greedy rows beside
drawn ones, rows of several kinds, top-k past the kernel's) return None: the caller draws as before.
"""
from __future__ import annotations

import logging
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from engine.step_inputs import pow2_bucket

PARAMS, PENALTIES = 5, 3  # per row: the draw's (T, top-k, top-p, min-p, u); (repetition, presence, frequency)
MAX_HISTORY = 4096  # penalised history widths (powers of two) a graph takes; past it the eager path
MAX_GRAPHS = 32  # kept graphs, least recently used dropped first (each holds its candidates and scratch)
STAGING = 4  # pinned staging buffers in turn: the host writes one while the device may still copy the last
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Key:
    logits: int  # data_ptr: a graph reads the logits where they were at capture
    rows: int
    vocab: int
    width: int  # candidates per row (topk), 0: none
    history: int  # penalised history width, 0: no penalties
    frequency: bool
    pending: bool


class _Entry:
    """One key's device inputs, outputs and (once captured) graph."""

    def __init__(self, key: _Key, device: torch.device):
        r, h = key.rows, key.history
        self.key, self.size = key, r * (PARAMS + PENALTIES + 1 + h)
        self.inputs = torch.zeros(self.size, dtype=torch.int64, device=device)  # laid out as `_layout` says
        self.pending = torch.zeros(r, dtype=torch.int64, device=device)
        self.rows = torch.arange(r, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.seen = 0


def _layout(key: _Key) -> tuple[slice, slice, slice, slice]:
    """Where each part lies in an entry's int64 inputs: the draw table (fp64), penalties (fp64), history lengths,
    the histories (ids, the vocabulary size as padding)."""
    r = key.rows
    a, b, c = r * PARAMS, r * (PARAMS + PENALTIES), r * (PARAMS + PENALTIES + 1)
    return slice(0, a), slice(a, b), slice(b, c), slice(c, c + r * key.history)


class SamplingGraphs:
    """Owned by a CUDA runner; `sample` once per step whose rows all draw."""

    def __init__(self, device: torch.device, capture: bool = True):
        self.device = torch.device(device)
        self.capture = capture and self.device.type == "cuda"  # False: the same buffers, run eagerly (tests, CPU)
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self._staging: list[tuple[torch.Tensor, torch.cuda.Event | None]] = []
        self._turn = 0
        self._pool = None
        self.captures = self.replays = 0

    def sample(self, logits: torch.Tensor, states: list, histories: list, positions: list[int],
               pending: torch.Tensor | None) -> torch.Tensor | None:
        """The drawn ids (R,) of a step whose every row draws, as `sampling.sample_ids` would give them; None where
        this step is not one a graph covers. `positions`: each row's position; `pending`: see `sample_ids`."""
        from engine.sampling import GPU_CANDIDATES, _groups, _penalised_rows, _uniforms, _window

        if logits.dim() != 2 or logits.dtype != torch.float32 or not logits.is_contiguous() or not logits.numel():
            return None
        if len(_groups(states)) != 1 or any(s.params.greedy for s in states):
            return None
        params = [s.params for s in states]
        rows, vocab = logits.shape
        width = _width(params, vocab)
        penalised_rows = set(_penalised_rows(states, histories, pending))
        windows = [_window(histories[i], params[i].repeat_last_n, pending is not None) if i in penalised_rows else ()
                   for i in range(rows)]
        longest = max(map(len, windows)) + (pending is not None) if penalised_rows else 0
        if width > GPU_CANDIDATES or longest > MAX_HISTORY:
            return None
        key = _Key(logits.data_ptr(), rows, vocab, width, pow2_bucket(longest, 16) if longest else 0,
                   any(params[i].frequency_penalty for i in penalised_rows), pending is not None and bool(longest))
        entry = self._entry(key)
        uniforms = _uniforms(states, positions)
        table = [(p.temperature, min(p.top_k, vocab), p.top_p, p.min_p, u) for p, u in zip(params, uniforms)]
        factors = [(p.repetition_penalty, p.presence_penalty, p.frequency_penalty) if i in penalised_rows
                   else (1.0, 0.0, 0.0) for i, p in enumerate(params)]  # a row without penalties: written back as is
        self._send(entry, table, factors, windows)
        if key.pending:
            entry.pending.copy_(pending, non_blocking=True)
        with torch.inference_mode():  # the runner's logits are inference tensors, written by the penalties
            out = self._run(entry, logits)
        return out.clone()  # outside inference mode: the caller's tensor; and a graph's next replay writes over its own

    def _entry(self, key: _Key) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(key, self.device)
            while len(self._entries) > MAX_GRAPHS:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return entry

    def _send(self, entry: _Entry, table: list[tuple], factors: list[tuple], windows: list) -> None:
        """Writes the step's inputs into the next staging buffer and queues its one copy to the entry's inputs."""
        key = entry.key
        host, sent = self._staging_buffer(entry.size)
        flat = host.numpy()[: entry.size]
        floats = flat.view(np.float64)
        at_table, at_factors, at_lengths, at_history = _layout(key)
        floats[at_table] = np.asarray(table, dtype=np.float64).ravel()
        floats[at_factors] = np.asarray(factors, dtype=np.float64).ravel()
        flat[at_lengths] = [len(w) for w in windows]
        if key.history:
            hist = flat[at_history].reshape(key.rows, key.history)
            hist.fill(key.vocab)  # padding: past every real id
            for i, w in enumerate(windows):
                if len(w):
                    hist[i, : len(w)] = np.frombuffer(w, dtype=np.int64) if isinstance(w, array) else w
        entry.inputs.copy_(host[: entry.size], non_blocking=True)
        if sent is not None:
            sent.record()

    def _staging_buffer(self, size: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The next pinned buffer of at least `size` int64, once the copy that last read it has run."""
        pin = self.device.type == "cuda"
        if len(self._staging) < STAGING:
            self._staging.append((torch.zeros(0, dtype=torch.int64), torch.cuda.Event() if pin else None))
        self._turn = (self._turn + 1) % len(self._staging)
        host, sent = self._staging[self._turn]
        if sent is not None:
            sent.synchronize()
        if host.numel() < size:
            host = torch.zeros(pow2_bucket(size, 1024), dtype=torch.int64, pin_memory=pin)
            self._staging[self._turn] = host, sent
        return host, sent

    def _run(self, entry: _Entry, logits: torch.Tensor) -> torch.Tensor:
        entry.seen += 1
        if not self.capture or entry.seen == 1:  # a key seen once draws eagerly: most steps repeat their key
            return _draw(entry, logits)
        if entry.graph is None:
            try:
                self._capture(entry, logits)
            except RuntimeError as e:  # a capture the CUDA runtime refuses: every later step draws eagerly
                log.warning("sampling graphs off, drawing launch by launch: %s", e)
                self.capture, entry.graph = False, None
                return _draw(entry, logits)
        entry.graph.replay()
        self.replays += 1
        return entry.out

    def _capture(self, entry: _Entry, logits: torch.Tensor) -> None:
        side = torch.cuda.Stream()  # warm-up (first launches, workspaces) off the capture, as DecodeGraphs does
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _draw(entry, logits)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        entry.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(entry.graph, pool=self._pool):
            entry.out = _draw(entry, logits)
        self.captures += 1


def _width(params: list, vocab: int) -> int:
    """Candidates a row group takes (as `sampling._gpu_draw`): top-k rows their largest k, open rows FIRST_WIDTH."""
    from engine.sampling import FIRST_WIDTH, _filters

    limits = [min(p.top_k, vocab) for p in params]
    return max(limits) if limits[0] else min(FIRST_WIDTH, vocab) if _filters(params[0]) else 0


def _draw(entry: _Entry, logits: torch.Tensor) -> torch.Tensor:
    """What a graph runs: the penalties written into the logits, the candidates, the draw, the logits put back.
    The same kernels as `sampling._apply_penalties` and `sampling._gpu_draw`, on the entry's inputs."""
    from engine.sampling import _counts
    from kernels.penalties_triton import penalise_rows_triton, restore_rows_triton
    from kernels.sampling_triton import sample_rows_triton

    key, inputs = entry.key, entry.inputs
    table, penalties, lengths, history = _layout(key)
    hist = inputs[history].view(key.rows, key.history)
    original = None
    if key.history:
        if key.pending:
            hist.scatter_(1, inputs[lengths][:, None], entry.pending[:, None])
        counts = _counts(hist).float() if key.frequency else None
        factors = inputs[penalties].view(torch.float64).view(key.rows, PENALTIES).float()
        original = penalise_rows_triton(logits, entry.rows, hist, factors, counts)
    candidates = logits.topk(key.width, dim=-1, sorted=False) if key.width else None
    out = sample_rows_triton(logits, inputs[table].view(torch.float64).view(key.rows, PARAMS), candidates)
    if original is not None:
        restore_rows_triton(logits, entry.rows, hist, original)
    return out
