"""MLXRunner: the step's host-planned inputs in, fp32 logits of the sampled rows out (as torch, for the sampler)."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import torch

from engine.mlx_backend.cache import MLXSequenceKVCache
from engine.mlx_backend.model import CausalLM
from engine.step import StepBatch


class MLXRunner:
    """The same interface as ModelRunner (`run`, `accepts_device_tokens`, `host_ids`, `prefers_lookahead`)."""

    def __init__(self, model: CausalLM, cache: MLXSequenceKVCache, max_sampled_rows: int):
        self.model, self.cache = model, cache
        self.max_sampled_rows = max_sampled_rows
        self.peak_logit_elements = 0

    @property
    def prefers_lookahead(self) -> bool:
        """As ModelRunner: no CUDA graphs run ahead of the host here."""
        return False

    def accepts_device_tokens(self, num_seqs: int) -> bool:
        """As ModelRunner: a step here always takes its tokens from the host."""
        return False

    def host_ids(self, ids: torch.Tensor) -> None:
        """As ModelRunner: the ids are host tensors already."""
        return None

    def run(self, batch: StepBatch) -> tuple[torch.Tensor, None]:
        """As ModelRunner.run: the sampled rows' fp32 logits (the sampler takes their argmax)."""
        assert len(batch.logit_rows) <= self.max_sampled_rows, "the scheduler bounds sampled rows per step"
        self.cache.prepare_step()
        tokens = mx.array(batch.tokens.numpy().astype(np.int32))
        positions = mx.array(batch.positions.numpy().astype(np.int32))
        rows = mx.array(batch.logit_rows.numpy().astype(np.int32))
        logits = self.model(tokens, positions, self.cache, rows)
        mx.eval(logits, *self.cache.arrays())  # the cache writes are part of this step's graph
        self.peak_logit_elements = max(self.peak_logit_elements, logits.size)
        return torch.from_numpy(np.array(logits, copy=True)), None
