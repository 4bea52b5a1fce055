"""DecodeGraphs: decode-only steps replayed from CUDA graphs captured per batch-size bucket.

A graph is captured for (batch bucket, kv-length bucket, inputs version). Its inputs live in the runner's
step buffer (engine/step_inputs.py), whose addresses do not move: token ids, positions, the segment table
and write slots, all sent in one copy per step, so one graph serves any mix of sequence lengths. Padding
rows write the scratch column and padding segments are empty. Reallocating the step buffer or the cache's
storage bumps the inputs' version: stale graphs go. The graph ends with the rows' argmax (the greedy ids)
written over its own token ids, so a look-ahead step that feeds them back needs no copy at all, and a
greedy step no launch after the graph.
That argmax also ends the step (kernels/step_advance.py): the ids go straight into pinned host memory and
the step table moves on by one token, so steady greedy decoding is graph after graph, no copy between.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from engine.cache.book import attention_segments
from engine.models.layers import CausalLM
from engine.step import StepBatch
from engine.step_inputs import StepInputs
from kernels.argmax import argmax_rows
from kernels.step_advance import HOST_RING, host_ring

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
log = logging.getLogger(__name__)


class DecodeGraphs:
    def __init__(self, model: CausalLM, inputs: StepInputs, buckets: tuple[int, ...] = BATCH_BUCKETS,
                 compile_model: bool = False, step_advance: bool = True):
        self.model, self.inputs, self.cache = model, inputs, inputs.cache
        self.buckets = tuple(sorted(buckets))
        # attention stays one opaque op; the dynamo limits allow a compile per bucket (engine/process.py)
        self.forward = torch.compile(model, dynamic=False) if compile_model else model
        self._argmax_impl, self._argmax_scratch = _argmax_kernel(self.buckets[-1], self.cache.device)
        # the argmax ends the step on the device: ids to this pinned ring, the table one token on
        self.step_advance = step_advance and self._argmax_impl == "triton"
        self._host_ids = host_ring(self.buckets[-1]) if self.step_advance else None
        self._last: tuple[torch.Tensor, HostIds] | None = None  # the latest replay's greedy ids and their host twin
        # (batch bucket, kv bucket, tap layers) -> the graph and its outputs
        self.graphs: dict[tuple, _Graph] = {}
        self._version = inputs.version
        self._pool = None
        self.captures = self.replays = self.verify_replays = 0

    def accepts(self, batch: StepBatch) -> bool:
        """Decode-only steps, and verify steps: their rows attend one segment each (`attention_segments`), so a
        verify step of T rows is a decode step of T one-row segments, some sharing a column, every row sampled."""
        segs = attention_segments(batch.segments)
        return (
            0 < len(segs) <= self.buckets[-1]
            and all(s.q_len == 1 for s in segs)
            and len(batch.logit_rows) == len(segs)
            and self.cache.attention_impl != "reference"  # the reference reads the table on the host
        )

    @torch.inference_mode()
    def run(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (R, V) fp32 of a decode-only (or verify) step and their argmax (R,): views of the graph's outputs."""
        segs = attention_segments(batch.segments)
        n = len(segs)
        b = next(x for x in self.buckets if x >= n)
        fed, inputs = batch.device_tokens, self.inputs
        plan = inputs.prepare(num_tokens=b, num_segments=b, tokens=batch.tokens if fed is None else None)
        if inputs.version != self._version:
            self.graphs.clear()  # they read tensors that no longer exist
            self._pool, self.model.last_taps = None, None  # a new pool: the old one goes once its last tensor does
            self._version = inputs.version
        tokens = inputs.tokens
        if fed is not None and fed.data_ptr() != tokens.data_ptr():  # ids drawn outside the graph: copy them in
            tokens[:n].copy_(fed, non_blocking=True)
        key = (b, plan.max_kv_len, self.model.tap_layers)
        if key not in self.graphs:
            self.graphs[key] = self._capture(b)
        graph, logits, ids, taps = self.graphs[key]
        graph.replay()
        self.model.last_taps = taps  # the tap rows (a DFlash drafter's context) live in the graph's memory too
        self.replays += 1
        self.verify_replays += batch.verifies
        ids = ids[:n]
        if self.step_advance:
            inputs.advanced()
            self._last = ids, HostIds(self._host_ids, [s.start for s in segs])
        return logits[:n], ids

    def host_ids(self, ids: torch.Tensor) -> "HostIds | None":
        """Where `ids`, the greedy ids of the latest replay, reach the host without a copy; None for others."""
        return self._last[1] if self._last is not None and self._last[0] is ids else None

    def forward_step(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What a graph of bucket `b` runs: the forward over the step buffer's inputs, every row's logits, and
        their argmax, written over the token ids it has read (the next look-ahead step's input)."""
        inputs = self.inputs
        tokens = inputs.tokens[:b]
        logits = self.forward(tokens, inputs.positions[:b], self.cache, None)
        step = inputs.step_advance(self._host_ids) if self.step_advance else None
        return logits, argmax_rows(logits, self._argmax_scratch, impl=self._argmax_impl, out=tokens, step=step)

    def _capture(self, b: int) -> "_Graph":
        # Warm up on a side stream (Triton/inductor compile here, not during capture); it runs this
        # very step, so what it writes into the cache is what the replay writes again. What it writes into
        # the step buffer (ids over the tokens, the advanced table) is put back: the replay reads them.
        side = torch.cuda.Stream()
        with self.inputs.kept():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.forward_step(b)
            torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits, ids = self.forward_step(b)
        self.captures += 1
        log.debug("captured decode graph: batch %d, kv bucket %d", b, self.inputs.plan.max_kv_len)
        return _Graph(graph, logits, ids, self.model.last_taps)


class _Graph(NamedTuple):
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # (bucket, V) fp32
    ids: torch.Tensor  # (bucket,) the rows' argmax
    taps: tuple[torch.Tensor, ...] | None  # the model's tap outputs (CausalLM.last_taps), when it had tap layers


class HostIds:
    """A replayed step's greedy ids in the pinned host ring (row r at slot position_r % HOST_RING); read them
    once the step's event has passed."""

    def __init__(self, ring: torch.Tensor, positions: list[int]):
        self._ring = ring.numpy()
        self._slots = [p % HOST_RING for p in positions]

    def tolist(self) -> list[int]:
        return [int(self._ring[slot, row]) for row, slot in enumerate(self._slots)]


def _argmax_kernel(rows: int, device: torch.device) -> tuple[str, object]:
    """The Triton argmax and its scratch where Triton runs, else torch's argmax."""
    from kernels import triton_available

    if not triton_available():
        return "reference", None
    from kernels.argmax_triton import ArgmaxScratch

    return "triton", ArgmaxScratch(rows, device)
