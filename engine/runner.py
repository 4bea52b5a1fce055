"""ModelRunner: owns the model and the cache tensors; runs one forward for a step."""
from __future__ import annotations

import torch

from engine.cache import KVCache
from engine.models.layers import CausalLM
from engine.step import StepBatch


class ModelRunner:
    def __init__(self, model: CausalLM, cache: KVCache, max_sampled_rows: int):
        self.model, self.cache = model, cache
        self.max_sampled_rows = max_sampled_rows
        self.peak_logit_elements = 0  # accounting: the largest logits tensor any step materialised

    @torch.inference_mode()
    def run(self, batch: StepBatch) -> torch.Tensor:
        """Logits (R, V) in fp32 for the batch's sampled rows only."""
        assert len(batch.logit_rows) <= self.max_sampled_rows, "the scheduler bounds sampled rows per step"
        self.cache.prepare_step()
        logits = self.model(batch.tokens, batch.positions, self.cache, batch.logit_rows)
        self.peak_logit_elements = max(self.peak_logit_elements, logits.numel())
        return logits
