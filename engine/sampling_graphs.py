"""SamplingGraphs: a sampled step's penalties, candidates and draw replayed from one CUDA graph.

Drawn one launch at a time, a sampled step of the app's defaults cost the host ~0.5 ms after the decode graph (H200,
270M shape: 0.45x greedy): three small host-to-device copies, the penalty kernels, topk, the draw kernel and the
penalties taken back, each launched from Python. Here a step's host inputs (each row's draw parameters and uniform,
its penalties and its penalised history) are written into pinned staging memory and sent in one copy to a device
buffer a captured graph reads as data; the graph runs the same kernels in the same order as `sampling.sample_ids`
launch by launch (penalties, greedy rows' argmax, each kind of row's candidates and draw, penalties taken back), so a
row draws the same token either way (tested).

A graph is kept per step shape (logits' address, rows, which rows are greedy and which draw together, candidates,
history width, frequency, pending token) and captured the second time its shape comes (a one-off step draws eagerly
from the same buffers). Steps past what it takes (top-k past the kernel's, penalised histories past MAX_HISTORY)
return None: the caller draws launch by launch.
"""
from __future__ import annotations

import logging
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from engine.sampling import (GPU_CANDIDATES, _argmax, _counts, _uniforms, _window, candidate_width, param_groups,
                             penalised, penalty_factors, whole_row)
from engine.step_inputs import pow2_bucket
from kernels.penalties_triton import penalise_rows_triton, restore_rows_triton
from kernels.sampling_triton import sample_rows_triton

PARAMS, PENALTIES = 5, 3  # per row: the draw's (T, top-k, top-p, min-p, u); (repetition, presence, frequency)
MAX_HISTORY = 4096  # penalised history widths (powers of two) a graph takes; past it the eager path
MAX_GRAPHS = 32  # kept graphs, least recently used dropped first (each holds its candidates and scratch)
LANES_FROM = 16  # rows from which the uniforms are computed in numpy's lanes
STAGING = 4  # pinned staging buffers in turn: the host writes one while the device may still copy the last
log = logging.getLogger(__name__)
_Group = tuple[tuple[int, ...], int, tuple[bool, bool]]


@dataclass(frozen=True)
class _Key:
    logits: int  # data_ptr: a graph reads the logits where they were at capture
    rows: int
    vocab: int
    groups: tuple[_Group, ...]  # drawn rows of one kind, their candidates (topk; 0: none) and `whole_row`
    greedy: tuple[int, ...]  # rows that take the argmax
    history: int  # penalised history width, 0: no penalties
    frequency: bool
    pending: bool
    argmax: bool  # the step's argmax comes with it (greedy rows, no penalties): copied in, as sample_ids uses it


class _Entry:
    """One key's device inputs, outputs and (once captured) graph."""

    def __init__(self, key: _Key, device: torch.device):
        r, h = key.rows, key.history
        self.key, self.size = key, r * (PARAMS + PENALTIES + 1 + h)
        self.inputs = torch.zeros(self.size, dtype=torch.int64, device=device)  # laid out as `_layout` says
        self.pending = torch.zeros(r, dtype=torch.int64, device=device)
        self.rows = torch.arange(r, device=device)
        self.index = [torch.tensor(rows, device=device) for rows, _, _ in key.groups]
        self.argmax = torch.zeros(r, dtype=torch.int64, device=device) if key.argmax else None
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
    """Owned by a CUDA runner; `sample` once per step with drawn rows."""

    def __init__(self, device: torch.device, capture: bool = True):
        self.device = torch.device(device)
        self.capture = capture and self.device.type == "cuda"  # False: the same buffers, run eagerly (tests, CPU)
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self._staging: list[tuple[torch.Tensor, np.ndarray, torch.cuda.Event | None]] = []
        self._turn = 0
        self._pool = None
        self._rows: _Rows | None = None
        self.captures = self.replays = 0

    def _rows_of(self, states: list, vocab: int) -> _Rows:
        """The step's rows as their parameters decide them: the last step's where each row has the same parameters
        object (a setting changed replaces it: `SamplerState.update`), as most steps do."""
        last = self._rows
        if (last is None or last.vocab != vocab or len(last.params) != len(states)
                or any(p is not s.params for p, s in zip(last.params, states))):
            last = self._rows = _Rows.of(tuple(s.params for s in states), vocab)
        return last

    def sample(self, logits: torch.Tensor, states: list, histories: list, positions: list[int],
               pending: torch.Tensor | None, argmax: torch.Tensor | None = None) -> torch.Tensor | None:
        """The ids (R,) `sampling.sample_ids` gives for a step with drawn rows; None where the step is past what a graph
        takes. `positions`: each row's position; `pending`, `argmax`: as `sample_ids` takes them."""
        if logits.dim() != 2 or logits.dtype != torch.float32 or not logits.is_contiguous() or not logits.numel():
            return None
        entry = self.stage(logits, states, histories, positions, pending, argmax)
        if entry is None:
            return None
        with torch.inference_mode():  # the runner's logits are inference tensors, written by the penalties
            out = self._run(entry, logits)
        return out.clone()  # outside inference mode: the caller's tensor; and a graph's next replay writes over its own

    def stage(self, logits: torch.Tensor, states: list, histories: list, positions: list[int],
              pending: torch.Tensor | None, argmax: torch.Tensor | None = None) -> _Entry | None:
        """The host's part of `sample`: the step's key, and its inputs queued to that key's device buffers."""
        rows = self._rows_of(states, logits.shape[1])
        step = _plan(logits, rows, histories, pending, argmax)
        if step is None:
            return None
        key, windows, factors = step
        entry = self._entry(key)
        table = rows.table.copy()
        table[:, -1] = _uniforms_array(states, positions)
        self._send(entry, table, factors, windows)
        if key.pending:
            entry.pending.copy_(pending, non_blocking=True)
        if key.argmax:
            entry.argmax.copy_(argmax, non_blocking=True)
        return entry

    def _entry(self, key: _Key) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(key, self.device)
            while len(self._entries) > MAX_GRAPHS:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return entry

    def _send(self, entry: _Entry, table: np.ndarray, factors: np.ndarray, windows: list) -> None:
        """Writes the step's inputs into the next staging buffer and queues its one copy to the entry's inputs."""
        key = entry.key
        host, view, sent = self._staging_buffer(entry.size)
        flat = view[: entry.size]
        floats = flat.view(np.float64)
        at_table, at_factors, at_lengths, at_history = _layout(key)
        floats[at_table] = table.ravel()
        floats[at_factors] = factors.ravel()
        flat[at_lengths] = [len(w) for w in windows]
        if key.history:  # one int64 buffer, each window padded past every real id: an array's bytes copy fastest
            pad, buf = array("q", [key.vocab]) * key.history, array("q")
            for w in windows:
                buf.extend(w if isinstance(w, array) else array("q", w))
                buf.extend(pad[: key.history - len(w)])
            flat[at_history] = np.frombuffer(buf, dtype=np.int64)
        entry.inputs.copy_(host[: entry.size], non_blocking=True)
        if sent is not None:
            sent.record()

    def _staging_buffer(self, size: int) -> tuple[torch.Tensor, np.ndarray, torch.cuda.Event | None]:
        """The next pinned buffer of at least `size` int64 (and its numpy view), once the copy that last read it ran."""
        pin = self.device.type == "cuda"
        if len(self._staging) < STAGING:
            empty = torch.zeros(0, dtype=torch.int64)
            self._staging.append((empty, empty.numpy(), torch.cuda.Event() if pin else None))
        self._turn = (self._turn + 1) % len(self._staging)
        host, view, sent = self._staging[self._turn]
        if sent is not None:
            sent.synchronize()
        if host.numel() < size:
            host = torch.zeros(pow2_bucket(size, 1024), dtype=torch.int64, pin_memory=pin)
            view = host.numpy()
            self._staging[self._turn] = host, view, sent
        return host, view, sent

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


@dataclass(frozen=True, eq=False)
class _Rows:
    """What a step's rows' parameters alone decide: kept from step to step while they stay (`SamplingGraphs._rows_of`)."""
    params: tuple
    vocab: int
    greedy: tuple[int, ...]
    groups: tuple[_Group, ...]  # as `_Key.groups`
    penalisable: tuple[int, ...]  # rows with penalties, penalised once they have a history
    frequency: bool  # some penalisable row has a frequency penalty
    table: np.ndarray  # (R, PARAMS) fp64 draw table, its uniforms' column left to each step
    factors: np.ndarray  # (R, PENALTIES) fp64 when every penalisable row is penalised; (1, 0, 0) for other rows

    @staticmethod
    def of(params: tuple, vocab: int) -> _Rows:
        greedy = tuple(i for i, p in enumerate(params) if p.greedy)
        drawn = [i for i, p in enumerate(params) if not p.greedy]
        groups = tuple(_group(tuple(drawn[j] for j in g), params, vocab)
                       for g in param_groups([params[i] for i in drawn]))
        penalisable = tuple(i for i, p in enumerate(params) if penalised(p))
        table = np.array([(p.temperature, min(p.top_k, vocab), p.top_p, p.min_p, 0.0) for p in params],
                         dtype=np.float64).reshape(len(params), PARAMS)
        return _Rows(params, vocab, greedy, groups, penalisable, any(params[i].frequency_penalty for i in penalisable),
                     table, _factors(params, penalisable))


def _group(rows: tuple[int, ...], params: tuple, vocab: int) -> _Group:
    """Drawn rows of one kind, their candidates' width and `whole_row`."""
    kind = [params[i] for i in rows]
    return rows, candidate_width(kind, vocab), whole_row(kind)


def _factors(params: tuple, penalised_rows) -> np.ndarray:
    """Each row's (repetition, presence, frequency); a row without penalties (1, 0, 0): its logits written back as is."""
    out = np.tile(np.array([1.0, 0.0, 0.0]), (len(params), 1))
    for i in penalised_rows:
        out[i] = penalty_factors(params[i])
    return out


def _plan(logits: torch.Tensor, rows: _Rows, histories: list, pending: torch.Tensor | None,
          argmax: torch.Tensor | None) -> tuple[_Key, list, np.ndarray] | None:
    """The step's key, each row's penalised history window and its penalty factors; None past what a graph takes."""
    n, vocab = logits.shape
    ahead = pending is not None
    penalised_rows = [i for i in rows.penalisable if ahead or len(histories[i])]
    windows: list = [()] * n
    for i in penalised_rows:
        windows[i] = _window(histories[i], rows.params[i].repeat_last_n, ahead)
    longest = max(len(windows[i]) for i in penalised_rows) + ahead if penalised_rows else 0
    if not rows.groups or max(w for _, w, _ in rows.groups) > GPU_CANDIDATES or longest > MAX_HISTORY:
        return None
    every = len(penalised_rows) == len(rows.penalisable)  # a row not yet penalised: written back as is
    factors = rows.factors if every else _factors(rows.params, penalised_rows)
    frequency = rows.frequency if every else any(rows.params[i].frequency_penalty for i in penalised_rows)
    key = _Key(logits.data_ptr(), n, vocab, rows.groups, rows.greedy, pow2_bucket(longest, 16) if longest else 0,
               frequency, ahead and bool(penalised_rows), bool(rows.greedy) and not penalised_rows and argmax is not None)
    return key, windows, factors


def _uniforms_array(states: list, positions: list[int]) -> np.ndarray | list[float]:
    """`sampling._uniforms`, in uint64 lanes for many rows (numpy's products wrap mod 2**64 as its masks do): the
    same numbers; a few rows as it computes them (numpy's calls cost more than a few rows' Python)."""
    if len(states) < LANES_FROM:
        return _uniforms(states, positions)
    key = np.fromiter((s.key for s in states), dtype=np.uint64, count=len(states))
    z = key + (np.asarray(positions, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _draw(entry: _Entry, logits: torch.Tensor) -> torch.Tensor:
    """What a graph runs, on the entry's inputs, as `sampling.sample_ids` launches it: the penalties written into the
    logits, the greedy rows' argmax, each group's candidates and draw (`sampling._gpu_draw`), the logits put back."""
    key, inputs = entry.key, entry.inputs
    at_table, at_factors, at_lengths, at_history = _layout(key)
    hist = inputs[at_history].view(key.rows, key.history)
    original = None
    if key.history:
        if key.pending:
            hist.scatter_(1, inputs[at_lengths][:, None], entry.pending[:, None])
        counts = _counts(hist).float() if key.frequency else None
        factors = inputs[at_factors].view(torch.float64).view(key.rows, PENALTIES).float()
        original = penalise_rows_triton(logits, entry.rows, hist, factors, counts)
    ids = _draw_groups(entry, logits, inputs[at_table].view(torch.float64).view(key.rows, PARAMS))
    if original is not None:
        restore_rows_triton(logits, entry.rows, hist, original)
    return ids


def _draw_groups(entry: _Entry, logits: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    key = entry.key
    if key.greedy:  # the step's argmax as given, or the penalised logits' (`sampling._argmax` on a GPU)
        ids = entry.argmax.clone() if key.argmax else _argmax(logits)
    else:
        ids = torch.empty(key.rows, dtype=torch.int64, device=logits.device)
    for (rows, width, (whole, nucleus)), index in zip(key.groups, entry.index):
        if len(rows) == key.rows:  # every row draws alike: the logits themselves, as sample_ids passes them
            group, params = logits, table
        else:
            group, params = logits.index_select(0, index), table.index_select(0, index)
        candidates = group.topk(width, dim=-1, sorted=False) if width else None
        drawn = sample_rows_triton(group, params, candidates, whole=whole, nucleus=nucleus)
        if len(rows) == key.rows:
            return drawn
        ids.index_copy_(0, index, drawn)
    return ids
