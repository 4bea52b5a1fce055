"""Batcher: schedule -> build the step -> run one forward -> sample -> commit. No threads here."""
from __future__ import annotations

import torch

from engine.cache import KVCache
from engine.models.layers import CausalLM
from engine.runner import ModelRunner
from engine.sampling import sample
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.step import build_step


class Batcher:
    def __init__(
        self,
        model: CausalLM,
        cache: KVCache,
        config: SchedulerConfig,
        device: torch.device | str,
        release_on_finish: bool = True,
        runner=None,
    ):
        self.cache, self.device = cache, device
        self.release_on_finish = release_on_finish  # sessions keep their cache between turns
        self.in_flight: list[Sequence] = []  # the sequences of the step being run (for error reports)
        self.scheduler = Scheduler(config, cache)
        # Another backend (MLX) brings its own runner; everything else here is backend-neutral.
        self.runner = runner or ModelRunner(model, cache, config.max_sampled_rows)
        self.steps = 0

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def fork(self, seq: Sequence, seq_id: int) -> Sequence:
        """A new running sequence sharing `seq`'s history and cached prefix (the cache copies it)."""
        child = Sequence(seq_id, list(seq.token_ids), seq.sampler.fork(), seq.stop_ids, seq.max_len)
        child.slot = self.cache.seq_clone(seq.slot)
        child.num_cached, child.num_prompt = seq.num_cached, seq.num_prompt
        child.generated = list(seq.generated)
        self.scheduler.adopt(child)
        return child

    def rewind(self, seq: Sequence, pos: int) -> None:
        """Drops everything from token `pos` on, in the cache and in the history (edit / regenerate)."""
        cached = min(pos, seq.num_cached)
        self.cache.rewind(seq.slot, cached)
        seq.num_cached = cached
        dropped = len(seq.token_ids) - pos
        del seq.token_ids[pos:]
        if dropped > 0:
            del seq.generated[max(0, len(seq.generated) - dropped) :]

    def step(self) -> list[tuple[Sequence, int]]:
        """One forward over every scheduled sequence; returns the (sequence, token) pairs sampled."""
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        self.in_flight = [seq for seq, _ in scheduled]
        try:
            batch = build_step(scheduled, self.cache)
            logits = self.runner.run(batch)
            tokens = sample(logits, [s.sampler for s in batch.samplers], [s.token_ids for s in batch.samplers])
        except BaseException:
            if self.cache.book.pending is not None:
                self.cache.abort_step()
            raise
        self.cache.commit_step()
        self.steps += 1
        for seq, n in scheduled:
            seq.num_cached += n
        for seq, token in zip(batch.samplers, tokens):
            seq.append(token)
            reason = finish_reason(seq, token)
            if reason:
                self.scheduler.finish(seq, reason, self.release_on_finish)
        self.in_flight = []
        return list(zip(batch.samplers, tokens))


def finish_reason(seq: Sequence, token: int) -> str | None:
    if token in seq.stop_ids:
        return "stop"
    if len(seq.generated) >= seq.sampler.params.max_tokens:
        return "length"
    if len(seq.token_ids) >= seq.max_len:
        return "context_full"
    return None
