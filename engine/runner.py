"""ModelRunner: owns the model and the cache tensors; runs one forward for a step."""
from __future__ import annotations

import os

import torch

from engine.cache import KVCache, SequenceKVCache
from engine.models.layers import CausalLM
from engine.step import StepBatch


class ModelRunner:
    """Eager forwards; on CUDA with the `sequence` layout, decode-only steps replay CUDA graphs."""

    def __init__(self, model: CausalLM, cache: KVCache, max_sampled_rows: int, graphs: bool | None = None,
                 compile_decode: bool = False, decode_gemm: bool | None = None, fused_kernels: bool = True,
                 decode_splits: int | None = None, step_advance: bool = True):
        self.model, self.cache = model, cache
        self.max_sampled_rows = max_sampled_rows
        self.peak_logit_elements = 0  # accounting: the largest logits tensor any step materialised
        if cache.device.type == "cuda":
            prefer_cublas_without_workspace()
            model.fuse_projections()  # decode on a GPU is launch-bound: one GEMM for q/k/v, one for gate/up
            if decode_gemm is None:  # with PDL the Triton GEMMs chain with the kernels around them (H200: 1.28x at 1)
                decode_gemm = fused_kernels and not compile_decode and _pdl(cache.device)
            model.use_decode_kernels(decode_gemm, decode_splits)  # splits: None = per K (kernels.linear)
            # norms/rope/activations fused by hand (3.5x faster uncompiled steps on an H200); inductor fuses its own
            model.use_fused_kernels(fused_kernels and not compile_decode)
        if graphs is None:
            graphs = cache.device.type == "cuda" and isinstance(cache, SequenceKVCache) and cache.uses_kernels
        self.graphs = None
        if graphs:
            from engine.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(model, cache, compile_model=compile_decode, step_advance=step_advance)

    def accepts_device_tokens(self, num_seqs: int) -> bool:
        """Whether a decode step of `num_seqs` may take its tokens from the last step's device ids."""
        return self.graphs is None or num_seqs <= self.graphs.buckets[-1]

    def host_ids(self, ids: torch.Tensor):
        """The host twin of `ids` when the step wrote them to the host itself (a replayed graph's greedy ids:
        a `tolist()`-able, valid once the step's event has passed), else None: copy them."""
        return self.graphs.host_ids(ids) if self.graphs is not None else None

    @torch.inference_mode()
    def run(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (R, V) in fp32 for the batch's sampled rows only, and their argmax when the step
        computed it already (replayed graphs), else None."""
        assert len(batch.logit_rows) <= self.max_sampled_rows, "the scheduler bounds sampled rows per step"
        greedy = None
        if self.graphs is not None and self.graphs.accepts(batch):
            logits, greedy = self.graphs.run(batch)
        else:
            self.cache.prepare_step()
            dev = self.cache.device
            tokens, positions, rows = (x.to(dev) for x in (batch.tokens, batch.positions, batch.logit_rows))
            if batch.device_tokens is not None:
                tokens = batch.device_tokens
            logits = self.model(tokens, positions, self.cache, rows)
        self.peak_logit_elements = max(self.peak_logit_elements, logits.numel())
        return logits, greedy


def prefer_cublas_without_workspace() -> None:
    """cuBLAS without a workspace, unless the user configured one. The decode LM head (1-64 rows by the whole
    vocabulary) then runs a kernel that needs no zeroed workspace: no memset launch before it (H200, Gemma-3
    head at 1 row: 82.2 vs 84.0 us; prefill-sized GEMMs unchanged). PyTorch reads this once, at its first
    cuBLAS call in the process: call it before any GPU matmul."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":0:0")


def _pdl(device: torch.device) -> bool:
    from kernels import triton_available

    if not triton_available():
        return False
    from kernels.pdl import pdl_supported

    return pdl_supported(device)
