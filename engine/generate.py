"""Synchronous generation for the CLI, tests and benchmarks: prompts in, token ids out, one batch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.backend import mlx_batcher, resolve_backend
from engine.batcher import Batcher
from engine.cache import CacheConfig, make_cache
from engine.cache.config import dtype_name
from engine.errors import ContextOverflowError
from engine.loading.loader import LoadedModel
from engine.sampling import SamplerState, SamplingParams
from engine.scheduler import SchedulerConfig
from engine.sequence import Sequence

TokenCallback = Callable[[int, int], None]  # (prompt index, token id)


@dataclass(slots=True)
class RunConfig:
    kv_layout: str = "sequence"
    max_seq_len: int | None = None  # None: the model's context length
    step_tokens: int = 512
    chunk_tokens: int = 256
    max_sampled_rows: int = 64
    backend: str = "torch"  # or "mlx"
    lookahead: bool | None = None  # None: on where CUDA graphs run (tests force it on CPU)


def make_batcher(lm: LoadedModel, max_seqs: int, run: RunConfig) -> Batcher:
    """A batcher whose cache holds `max_seqs` sequences of up to the model's (or the given) context."""
    args = lm.args
    max_len = run.max_seq_len or args.max_position_embeddings
    dtype = dtype_name(next(lm.model.parameters()).dtype)
    config = CacheConfig(
        layout=run.kv_layout,
        max_seqs=max_seqs,
        max_seq_len=max_len,
        capacity=max_seqs * max_len,
        dtype=dtype,
        max_step_tokens=run.chunk_tokens,
    )
    sched = SchedulerConfig(run.step_tokens, run.chunk_tokens, run.max_sampled_rows)
    if resolve_backend(run.backend, "cpu") == "mlx":
        return mlx_batcher(lm, config, sched)
    device = next(lm.model.parameters()).device
    cache = make_cache(config, args.layer_windows(), args.num_kv_heads, args.head_dim, device)
    return Batcher(lm.model, cache, sched, device, lookahead=run.lookahead)


def generate(
    lm: LoadedModel,
    prompts: list[list[int]],
    params: SamplingParams,
    run: RunConfig | None = None,
    on_token: TokenCallback | None = None,
    batcher: Batcher | None = None,
) -> list[Sequence]:
    """Runs every prompt as a concurrent sequence of one batch until each finishes."""
    run = run or RunConfig()
    batcher = batcher or make_batcher(lm, max(1, len(prompts)), run)
    limit = batcher.cache.config.max_seq_len
    seqs = []
    for i, ids in enumerate(prompts):
        if len(ids) >= limit:
            raise ContextOverflowError(f"Prompt {i} has {len(ids)} tokens; the context holds {limit}.")
        seq = Sequence(i, list(ids), SamplerState(params), lm.tokenizer.stop_ids, max_len=limit)
        seqs.append(seq)
        batcher.add(seq)
    while batcher.has_work():
        for seq, token in batcher.step():
            if on_token:
                on_token(seq.seq_id, token)
    return seqs


