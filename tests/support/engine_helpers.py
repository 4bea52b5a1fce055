"""Helpers for engine tests: full-logit forwards and staggered batched generation."""
from __future__ import annotations

import torch

from engine.batcher import Batcher
from bench.runs import RunConfig, make_batcher
from engine.loading.loader import LoadedModel
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence


def full_logits(lm: LoadedModel, ids: list[int], layout: str = "sequence", chunk: int = 8) -> torch.Tensor:
    """Logits at every position of `ids`, prefilled chunk by chunk through the cache."""
    b = make_batcher(lm, 1, RunConfig(kv_layout=layout, max_seq_len=len(ids) + 8, step_tokens=chunk, chunk_tokens=chunk))
    cache, slot, out = b.cache, b.cache.seq_new(), []
    for start in range(0, len(ids), chunk):
        n = min(chunk, len(ids) - start)
        cache.declare_step([(slot, n)])
        cache.prepare_step()
        with torch.inference_mode():
            out.append(lm.model(torch.tensor(ids[start : start + n]), torch.arange(start, start + n), cache, torch.arange(n)))
        cache.commit_step()
    return torch.cat(out)


def run_staggered(
    batcher: Batcher, prompts: list[list[int]], arrivals: list[int], params: SamplingParams | list[SamplingParams],
    stop_ids=frozenset(),
) -> list[list[int]]:
    """Adds prompt i at step arrivals[i]; runs until all finish; returns each one's generated ids. `params`: one
    for all, or one per prompt."""
    return [s.generated for s in staggered_sequences(batcher, prompts, arrivals, params, stop_ids)]


def assert_staggered_alone(lm, layout: str, min_tiled: set[str] | int = 0) -> None:
    """Greedy sessions of `lm` staggered into one batcher (prefills of many rows, decode rows of few) give exactly
    the tokens each gives alone; `min_tiled`: how many matrices, or which source types, the AMX tiles hold."""
    from engine.quant.weight import QuantTensor

    tiled = [m.source_type for m in lm.model.modules() if isinstance(m, QuantTensor) and m.code_layout
             and m.code_layout.tiles]
    assert set(tiled) >= min_tiled if isinstance(min_tiled, set) else len(tiled) >= min_tiled
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(6, lm.args.vocab_size, (n,), generator=g).tolist() for n in (5, 23, 40, 9, 31)]
    run = RunConfig(max_seq_len=128, kv_layout=layout)
    params = SamplingParams(max_tokens=12)
    batched = run_staggered(make_batcher(lm, 5, run), prompts, [0, 0, 1, 3, 3], params)
    alone = [run_staggered(make_batcher(lm, 1, run), [p], [0], params)[0] for p in prompts]
    assert batched == alone


def staggered_sequences(
    batcher: Batcher, prompts: list[list[int]], arrivals: list[int], params: SamplingParams | list[SamplingParams],
    stop_ids=frozenset(), guides: list | None = None,
) -> list[Sequence]:
    """run_staggered's sequences themselves; `guides`: per prompt None or a callable giving its grammar's guide
    (engine/constraint), made as the prompt arrives."""
    each = params if isinstance(params, list) else [params] * len(prompts)
    seqs = [Sequence(i, list(p), SamplerState(sp), stop_ids) for i, (p, sp) in enumerate(zip(prompts, each))]
    guides = guides or [None] * len(prompts)
    step = 0
    while step <= max(arrivals) or batcher.has_work():
        for seq, guide, at in zip(seqs, guides, arrivals):
            if at == step:
                seq.guide = guide() if guide else None
                batcher.add(seq)
        batcher.step()
        step += 1
    return seqs


def alone(lm: LoadedModel, prompt: list[int], params: SamplingParams, run: RunConfig) -> list[int]:
    b = make_batcher(lm, 1, run)
    return run_staggered(b, [prompt], [0], params)[0]
