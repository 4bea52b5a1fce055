"""Synchronous runs for benchmarks and tests: prompts in, token ids out, one batch, on a runtime from build_runtime."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


from engine.batcher import Batcher
from engine.errors import ContextOverflowError
from engine.loading.loader import LoadedModel
from engine.runtime import EngineConfig, ModelRuntime, build_runtime
from engine.sampling import SamplerState, SamplingParams
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
    speculative: str = "off"  # engine/speculative: "off" or "lookup"


def make_runtime(lm: LoadedModel, max_seqs: int, run: RunConfig) -> ModelRuntime:
    """A runtime whose cache holds `max_seqs` sequences of up to the model's (or the given) context; a finished
    sequence gives its slot back at once."""
    config = EngineConfig(kv_layout=run.kv_layout, max_sessions=max_seqs, max_session_tokens=run.max_seq_len,
                          step_tokens=run.step_tokens, chunk_tokens=run.chunk_tokens,
                          max_sampled_rows=run.max_sampled_rows, backend=run.backend, lookahead=run.lookahead,
                          speculative=run.speculative)
    return build_runtime(lm, config, keep_finished=False)


def make_batcher(lm: LoadedModel, max_seqs: int, run: RunConfig) -> Batcher:
    return make_runtime(lm, max_seqs, run).batcher


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


