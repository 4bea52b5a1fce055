"""Scheduler: continuous batching with a per-step token budget and fixed-size prefill chunks."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from engine.cache import KVCache
from engine.errors import CacheConfigError
from engine.sequence import Sequence, Status


@dataclass(slots=True)
class SchedulerConfig:
    step_tokens: int = 512  # token budget of one forward
    chunk_tokens: int = 256  # prefill chunk; chunk boundaries depend only on the sequence itself
    max_sampled_rows: int = 64  # logit rows per step: buffers are sized to this, not to the budget

    def __post_init__(self) -> None:
        if not 1 <= self.chunk_tokens <= self.step_tokens:
            raise CacheConfigError("chunk_tokens must be between 1 and step_tokens.")
        if self.max_sampled_rows < 1:
            raise CacheConfigError("max_sampled_rows must be at least 1.")


class Scheduler:
    """Admits waiting sequences into free cache slots; each step, decodes first, then prefill chunks."""

    def __init__(self, config: SchedulerConfig, cache: KVCache):
        self.config, self.cache = config, cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._arrived: dict[Sequence, float] = {}  # when a sequence's turn was asked for (`stamp`), until admitted
        self._rank: dict[Sequence, int] = {}  # its group's sequences queued or running before it came, until admitted
        self._groups: dict[int, set[Sequence]] = {}  # each group's sequences queued or running
        self._turn = 0  # rotates who goes first, so no sequence starves under a tight budget

    def stamp(self, seq: Sequence, arrived: float) -> None:
        """When `seq`'s turn was asked for (a perf_counter time): its place in the queue, whenever it is added."""
        # a turn stopped before it was queued (a compare column waiting for another's prefill) leaves its stamp here
        self._arrived = {s: at for s, at in self._arrived.items() if s.status is not Status.FINISHED}
        self._arrived[seq] = arrived

    def add(self, seq: Sequence) -> None:
        """Queues a sequence for a slot behind those that arrived before it: turns' prompts render on several
        threads and get ready in any order, so the order they are added in is not the order they were sent in. A
        sequence of a group (`Sequence.group`) also goes behind every other group's earlier members: a request of 256
        prompts took the slots until its last answer began, and a chat sent after it waited 23 s for its first token."""
        seq.status = Status.WAITING
        self._arrived.setdefault(seq, time.perf_counter())
        if seq.group is not None:
            members = self._groups.setdefault(seq.group, set())
            members.discard(seq)
            self._rank[seq] = len(members)
            members.add(seq)
        i = len(self.waiting)
        while i and self._place(self.waiting[i - 1]) > self._place(seq):
            i -= 1
        self.waiting.insert(i, seq)

    def _place(self, seq: Sequence) -> tuple[int, float]:
        return self._rank.get(seq, 0), self._arrived.get(seq, 0.0)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        self._admit()
        if not self.running:
            return []
        k = self._turn % len(self.running)
        order = self.running[k:] + self.running[:k]
        self._turn += 1
        budget, rows = self.config.step_tokens, 0
        out: list[tuple[Sequence, int]] = []
        # every other step a waiting prompt's next chunk is kept room for: where decodes could fill the budget
        # (step_tokens near chunk_tokens) a prompt otherwise waited for every answer to end
        held = self._held_for_prefill(order) if self._turn % 2 else 0
        for seq in order:
            if seq.num_uncached == 1 and budget > held and rows < self.config.max_sampled_rows:
                n = 1 + len(seq.draft)  # drafted tokens are verified in the same step, one sampled row each
                if n > min(budget - held, self.config.chunk_tokens) or rows + n > self.config.max_sampled_rows:
                    seq.draft, n = [], 1  # no room for its drafts this step: a plain decode
                out.append((seq, n))
                budget, rows = budget - n, rows + n
        for seq in order:
            n = min(self.config.chunk_tokens, seq.num_uncached)
            last = n == seq.num_uncached
            if seq.num_uncached > 1 and n <= budget and (not last or rows < self.config.max_sampled_rows):
                out.append((seq, n))
                budget, rows = budget - n, rows + last
        return out

    def _held_for_prefill(self, order: list[Sequence]) -> int:
        """The first prefilling sequence's next chunk, where the decodes would leave less than that."""
        chunk = next((min(self.config.chunk_tokens, s.num_uncached) for s in order if s.num_uncached > 1), 0)
        decodes = sum(1 + len(s.draft) for s in order if s.num_uncached == 1)
        return chunk if self.config.step_tokens - decodes < chunk else 0

    def adopt(self, seq: Sequence) -> None:
        """Runs a sequence that already holds a cache slot (a fork)."""
        seq.status = Status.RUNNING
        self.running.append(seq)

    def admit(self, seq: Sequence) -> None:
        """Runs a waiting sequence that was given a slot by other means (a copy of a cached prefix)."""
        self.waiting.remove(seq)
        self._forget(seq)
        self.adopt(seq)

    def _admit(self) -> None:
        while self.waiting and self.cache.book.free_slots:
            seq = self.waiting.popleft()
            self._forget(seq)
            seq.slot = self.cache.seq_new()
            seq.num_cached = 0
            seq.status = Status.RUNNING
            self.running.append(seq)

    def finish(self, seq: Sequence, reason: str, release: bool = True) -> None:
        """Ends a sequence's generation; `release` frees its cache slot, else the cache keeps its tokens."""
        seq.status, seq.finish_reason = Status.FINISHED, reason
        if seq in self.running:
            self.running.remove(seq)
            if release:
                self.release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._forget(seq)
        members = self._groups.get(seq.group)
        if members is not None:
            members.discard(seq)
            if not members:
                del self._groups[seq.group]

    def _forget(self, seq: Sequence) -> None:
        self._arrived.pop(seq, None)
        self._rank.pop(seq, None)

    def release(self, seq: Sequence) -> None:
        if seq.slot is not None:
            self.cache.seq_rm(seq.slot)
            seq.slot, seq.num_cached = None, 0

    def resume(self, seq: Sequence) -> None:
        """Schedules a sequence again: at once if it still holds a slot, else through admission."""
        if seq.slot is None:
            self.add(seq)
        else:
            self.adopt(seq)
