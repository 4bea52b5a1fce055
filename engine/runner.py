"""ModelRunner: owns the model and the step inputs; runs one forward for a step."""
from __future__ import annotations

import torch

from engine.cache import KVCache, SequenceKVCache
from engine.cache.book import attention_segments
from engine.cpu_tape import DecodeTapes
from engine.models.kernel_choice import KernelChoice, choose_kernels
from engine.models.layers import CausalLM
from engine.quant.weight import QuantTensor
from engine.step import StepBatch
from engine.step_inputs import StepInputs, pow2_bucket
from kernels.attention import triton_available

EAGER_LOGITS_BYTES = 32 << 20  # an eager CPU step's logits from this size on go to the runner's kept buffer


class ModelRunner:
    """Eager forwards; on CUDA with the `sequence` layout, decode-only steps replay CUDA graphs.

    The interface the batcher uses (MLXRunner has the same): `run`, `accepts_device_tokens`, `host_ids`,
    `prefers_lookahead`."""

    def __init__(self, model: CausalLM, cache: KVCache, max_sampled_rows: int, graphs: bool | None = None,
                 compile_decode: bool = False, kernels: KernelChoice | None = None, step_advance: bool = True,
                 tapes: bool | None = None):
        """`kernels`: None = `choose_kernels(cache.device, compile_decode=...)`, the engine's default. `tapes`: replay
        CPU decode steps (engine/cpu_tape.py); None = wherever the model and cache fit them."""
        self.model, self.cache = model, cache
        self.max_sampled_rows = max_sampled_rows
        self.peak_logit_elements = 0  # accounting: the largest logits tensor any step materialised
        self._logits_buffer: torch.Tensor | None = None  # `_eager_logits`' buffer
        model.prepare(kernels if kernels is not None else choose_kernels(cache.device, compile_decode=compile_decode))
        kernel_cache = isinstance(cache, SequenceKVCache) and cache.uses_kernels
        self.inputs = StepInputs(cache) if kernel_cache else None  # the step buffer the kernels (and graphs) read
        if graphs is None:
            graphs = cache.device.type == "cuda" and kernel_cache
        # a mixture whose experts are routed on the host (not stacked on the device) cannot replay its steps
        graphs = graphs and all(getattr(m, "replayable", True) for m in model.modules())
        self.graphs = self.sampling_graphs = None
        if graphs:
            from engine.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(model, self.inputs, compile_model=compile_decode, step_advance=step_advance)
            if triton_available():  # a step with drawn rows: its penalties and draw from one graph too
                from engine.sampling_graphs import SamplingGraphs

                self.sampling_graphs = SamplingGraphs(cache.device)
        self.tapes = None
        if tapes is not False and self.graphs is None and DecodeTapes.fits(model, cache):
            self.tapes = DecodeTapes(model, cache)
        self.verify_rows = _verify_rows(model, self.graphs)
        self.tiled = _mostly_tiled(model)

    def verify_width(self, running: int, rows: int) -> int:
        """The rows a step of `running` sequences with drafts, `rows` in all, should be trimmed to: CPU tapes keep a
        few widths (DecodeTapes.width); else `rows`."""
        return self.tapes.width(running, rows) if self.tapes is not None else rows

    @property
    def prefers_lookahead(self) -> bool:
        """Whether queuing the next decode step before reading this one's ids pays: the device runs ahead of the
        host (replayed CUDA graphs)."""
        return self.graphs is not None

    def accepts_device_tokens(self, num_seqs: int) -> bool:
        """Whether a decode step of `num_seqs` may take its tokens from the last step's device ids."""
        return self.graphs is None or num_seqs <= self.graphs.buckets[-1]

    def host_ids(self, ids: torch.Tensor):
        """The host twin of `ids` when the step wrote them to the host itself (a replayed graph's greedy ids:
        a `tolist()`-able, valid once the step's event has passed), else None: copy them."""
        return self.graphs.host_ids(ids) if self.graphs is not None else None

    def _segment_bucket(self, batch: StepBatch) -> int | None:
        """A verify step's segment count, padded to a power of two: its rows attend one segment each, and the
        attention kernel is compiled per split count, which follows the segment count (kernels/sdpa_varlen_triton.py)."""
        if not batch.verifies:
            return None
        return pow2_bucket(len(attention_segments(batch.segments)))

    @torch.inference_mode()
    def run(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (R, V) in fp32 for the batch's sampled rows only, and their argmax when the step
        computed it already (replayed graphs), else None."""
        assert len(batch.logit_rows) <= self.max_sampled_rows, "the scheduler bounds sampled rows per step"
        greedy = None
        if self.graphs is not None and self.graphs.accepts(batch):
            logits, greedy = self.graphs.run(batch)
        elif self.tapes is not None and self.tapes.accepts(batch):
            logits = self.tapes.run(batch)
        else:
            if self.inputs is not None:
                self.inputs.prepare(num_segments=self._segment_bucket(batch))
            else:
                self.cache.prepare_step()
            dev = self.cache.device
            tokens, positions, rows = (x.to(dev) for x in (batch.tokens, batch.positions, batch.logit_rows))
            if batch.device_tokens is not None:
                tokens = batch.device_tokens
            self.model.logits_out = self._eager_logits(len(rows)) if dev.type == "cpu" else None
            try:
                logits = self.model(tokens, positions, self.cache, rows)
            finally:
                self.model.logits_out = None
        self.peak_logit_elements = max(self.peak_logit_elements, logits.numel())
        return logits, greedy

    def _eager_logits(self, rows: int) -> torch.Tensor | None:
        """Where an eager CPU step's logits go when they are large (a verify step of 8 sessions: 59 rows of 262k
        tokens, 62 MB): one buffer kept across steps, grown to the most rows seen, so that no step maps and zeroes
        fresh pages (the head of summarise's such steps: 30.4 -> 24.3 ms). Valid until the next step, as a tape's
        logits are."""
        vocab = self.model.args.vocab_size
        if rows * vocab * 4 < EAGER_LOGITS_BYTES:
            return None
        if self._logits_buffer is None or self._logits_buffer.shape[0] < rows:
            self._logits_buffer = torch.empty(rows, vocab, dtype=torch.float32)
        return self._logits_buffer


def _mostly_tiled(model: CausalLM) -> bool:
    """Whether most of the model's matrix bytes multiply on AMX tiles (kernels/cpu/amxgemm.c), where a step's extra
    rows cost little: 40 rows of the embedded model's head take 4.5x one row's time there, 8x in the vector kernels."""
    sizes = [(m.nbytes(), m.format == "blocks" and m.code_layout.tiles) for m in model.modules()
             if isinstance(m, QuantTensor)]
    return 2 * sum(n for n, tiled in sizes if tiled) > sum(n for n, _ in sizes) > 0


def _verify_rows(model: CausalLM, graphs) -> int | None:
    """The most rows a step with drafts should take (None: the step's own limits): the largest decode graph (a wider
    step runs eagerly), and where the model multiplies quantized weights in the Triton decode GEMMs, their row tile:
    up to it a step costs what one row does, past it each 16 rows add a dot on every weight (H200, 8B: 16 rows take
    ~1.1× one row's time, 64 rows ~3×; kernels/quant_linear_triton.py)."""
    if graphs is None:
        return None
    from kernels.quant_linear_triton import ROW_TILE

    quantized = any(isinstance(m, QuantTensor) and m.format in ("int4", "fp4", "int8") for m in model.modules())
    return min(graphs.buckets[-1], ROW_TILE) if quantized else graphs.buckets[-1]
