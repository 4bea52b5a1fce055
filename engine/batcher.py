"""Batcher: schedule -> build the step -> run one forward -> sample -> commit. No threads here.

Look-ahead: when a decode step's sequences all go on decoding, the next step is launched from the
sampled ids still on the device, before the host reads them; the host then does its bookkeeping
while the GPU runs. A token sampled for a sequence that meanwhile finished (a stop token, a stop
string) is dropped (a draw consumes no random state: engine/sampling.py keys each draw by position). The cache then holds one token more
than a plain run would have cached, a token of the history, so what it holds stays true.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch

from engine.cache import KVCache
from engine.constraint.guide import mask_rows
from engine.logit_bias import bias_rows
from engine.logprobs import TokenLogprob, row_logprobs
from engine.prompt_logprobs import prompt_rows, score_prompts
from engine.sampling import penalised, sample_ids
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence, Status
from engine.speculative.drafter import Drafter
from engine.speculative.verify import accept
from engine.step import StepBatch, build_step

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Launched:
    """A step whose forward and sampling are queued; its ids are not read yet."""

    samplers: list[Sequence]  # in row order of `ids`
    ids: torch.Tensor  # (R,) sampled ids, on the device
    host_ids: Any  # their host twin, `tolist()`-able: filled by then when `ready` has passed
    ready: torch.cuda.Event | None  # None: the device is the host
    decode: bool  # every scheduled sequence wrote one token and samples: a look-ahead may follow
    verified: list[list[int]] | None = None  # a verify step's tokens per sampler, read already
    logprobs: list[list[TokenLogprob]] | None = None  # per sampler, for its tokens: where its params ask for them

    def tokens(self) -> list[list[int]]:
        """Each sampler's new tokens: one, or a verify step's accepted drafts and the token after them."""
        if self.verified is not None:
            return self.verified
        if self.ready is not None:
            self.ready.synchronize()  # this step's copy only: a step queued after it keeps running
        return [[t] for t in self.host_ids.tolist()]


def _to_host(ids: torch.Tensor, runner) -> tuple[Any, torch.cuda.Event | None]:
    """Queues the ids' copy to the host now, before any later step: reading them then waits for no more.
    Ids the step itself wrote to the host (the runner's `host_ids`) need only the event."""
    if ids.device.type != "cuda":
        return ids, None
    host = runner.host_ids(ids)
    if host is None:
        host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        host.copy_(ids, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


class Batcher:
    def __init__(
        self,
        cache: KVCache,
        runner,  # ModelRunner or MLXRunner: run, accepts_device_tokens, host_ids, prefers_lookahead
        config: SchedulerConfig,
        device: torch.device | str,
        release_on_finish: bool = True,
        lookahead: bool | None = None,
        drafter: Drafter | None = None,
    ):
        self.cache, self.device = cache, device
        self.drafter = drafter  # proposes tokens that a step verifies (engine/speculative); None: plain decoding
        self.release_on_finish = release_on_finish  # sessions keep their cache between turns
        self.in_flight: list[Sequence] = []  # the sequences of the steps being run (for error reports)
        self.scheduler = Scheduler(config, cache)
        self.runner = runner  # the backend's; everything here is backend-neutral
        if lookahead is None:  # it pays where the device runs asynchronously: replayed CUDA graphs
            lookahead = self.runner.prefers_lookahead
        self.lookahead = lookahead
        self._ahead: Launched | None = None
        self.steps = self.lookahead_steps = 0

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def has_work(self) -> bool:
        return self._ahead is not None or self.scheduler.has_work()

    def has_ahead(self) -> bool:
        return self._ahead is not None

    def step(self) -> list[tuple[Sequence, int]]:
        """Runs one step and returns the (sequence, token) pairs it sampled.

        With look-ahead the step returned may be the one launched by the previous call, and the
        next one is already queued on the device when this returns.
        """
        launched, self._ahead = self._ahead, None
        if launched is None:
            launched = self._launch_scheduled()
            if launched is None:
                return []
        if self.lookahead and self._can_look_ahead(launched):
            try:
                self._ahead = self._launch_ahead(launched)
            except Exception:  # noqa: BLE001 - the plain next step meets (and reports) the same fault
                log.debug("look-ahead step not launched", exc_info=True)
        self.in_flight = launched.samplers + (self._ahead.samplers if self._ahead else [])
        try:
            results = self._resolve(launched)
        except BaseException:
            self._ahead = None  # its sequences are in in_flight: the caller fails them with this step's
            raise
        self.in_flight = self._ahead.samplers if self._ahead else []
        return results

    def settle(self) -> list[tuple[Sequence, int]]:
        """Reads the step queued ahead, if any, so that sequences can be changed from outside."""
        launched, self._ahead = self._ahead, None
        if launched is None:
            return []
        results = self._resolve(launched)
        self.in_flight = []
        return results

    # -- launching
    def _launch_scheduled(self) -> Launched | None:
        self._draft()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return None
        self.in_flight = [seq for seq, _ in scheduled]
        batch = build_step(scheduled, self.cache)
        if batch.verifies:
            return self._verify(batch)
        ids, logprobs = self._forward(batch)
        decode = len(batch.samplers) == len(scheduled) and all(n == 1 for _, n in scheduled)
        return Launched(batch.samplers, ids, *_to_host(ids, self.runner), decode, logprobs=logprobs)

    def _draft(self) -> None:
        """Asks the drafter for tokens after each sequence about to decode, as many as its limits leave room for."""
        running = self.scheduler.running
        for seq in running:
            seq.draft = []
        if self.drafter is None:
            return
        due = [seq for seq in running if seq.num_uncached == 1 and _draftable(seq)]
        if due and self._drafting(len(running), len(due)):
            rooms = [_draft_room(seq, self.cache.book.max_step_tokens) for seq in due]
            most = getattr(self.runner, "verify_rows", None)
            if most is not None:  # past the runner's verify rows a step costs more (an eager step, wider GEMM tiles)
                share = max(0, (most - len(running)) // len(due))
                rooms = [min(room, share) for room in rooms]
            self.drafter.propose(due, rooms)
            if self.drafter.name == "lookup" and hasattr(self.runner, "verify_width"):  # model drafters keep state
                n = len(running)
                _trim_drafts(due, self.runner.verify_width(n, n + sum(len(s.draft) for s in due)) - n)

    def _drafting(self, running: int, draftable: int) -> bool:
        """Whether a step of `running` sequences, `draftable` of them speculative, may verify drafts: the drafter takes
        that many, and the runner's verify rows leave each a draft (`_draft`'s share); else look-ahead steps go on (a
        lookup with no room would stop them: H200, 270M at 64 sessions, bf16: 1.73 ms a step against 0.76 without)."""
        if self.drafter is None or not 0 < draftable <= self.drafter.max_sequences:
            return False
        most = getattr(self.runner, "verify_rows", None)
        return most is None or running + draftable <= most

    def _verify(self, batch: StepBatch) -> Launched:
        """Runs a step with drafted tokens and reads it at once: what it accepts decides the next step's tokens."""
        try:
            logits, _ = self._run(batch)
            seqs = batch.samplers
            with _shaped(logits, seqs, [len(s.draft) + 1 for s in seqs]):
                accepted = accept(logits, [s.sampler for s in seqs], [s.draft for s in seqs],
                                  [s.penalty_history() for s in seqs], [len(s.token_ids) for s in seqs])
        except BaseException:
            self.cache.abort_step()
            raise
        self.cache.commit_step()
        self.steps += 1
        for seq, n in batch.scheduled:
            seq.num_cached += n
        logprobs = _logprobs(logits, seqs, accepted, [len(s.draft) + 1 for s in seqs])
        rows_kept = {id(seq): len(tokens) for seq, tokens in zip(batch.samplers, accepted) if seq.draft}
        self._record(batch, [rows_kept.get(id(seq), n) for seq, n in batch.scheduled])
        for seq, tokens in zip(batch.samplers, accepted):
            drafted, kept = len(seq.draft), len(tokens) - 1
            if kept < drafted:  # the rejected drafts' rows go from the cache
                seq.num_cached -= drafted - kept
                self.cache.rewind(seq.slot, seq.num_cached)
            if drafted:
                seq.num_drafted += drafted  # the kept ones count as they join the answer (_resolve)
                self.drafter.observe(seq, drafted, kept)
            seq.draft = []
        return Launched(batch.samplers, None, None, None, False, verified=accepted, logprobs=logprobs)

    def _forward(self, batch: StepBatch, ahead: bool = False) -> tuple[torch.Tensor, list | None]:
        """Queues forward and sampling and commits the cache step (its writes precede any later read); returns the
        sampled ids on the device, and the log-probabilities of samplers that ask for them (read at once: such a step
        has no look-ahead). `ahead`: a look-ahead step, whose ids go one place after the unread ones."""
        try:
            seqs = batch.samplers
            # the previous step's ids, which the host lacks yet, count for penalties: kept before the forward, whose
            # decode graph writes its own ids over them
            pending = batch.device_tokens.clone() if ahead and any(penalised(s.sampler.params) for s in seqs) else None
            logits, greedy = self._run(batch)
            graphs = getattr(self.runner, "sampling_graphs", None)
            with _shaped(logits, seqs) as shaped:  # biased or masked rows: the step's argmax read others
                ids = sample_ids(logits, [s.sampler for s in seqs], [s.penalty_history() for s in seqs],
                                 None if shaped else greedy, [len(s.token_ids) + ahead for s in seqs], pending, graphs)
            logprobs = _logprobs(logits, seqs, [[t] for t in ids.tolist()]) if _wants_logprobs(seqs) else None
        except BaseException:
            self.cache.abort_step()  # nothing to undo when the step failed before it was declared
            raise
        self.cache.commit_step()
        self.steps += 1
        for seq, n in batch.scheduled:
            seq.num_cached += n
        self._record(batch)
        return ids, logprobs

    def _run(self, batch: StepBatch):
        """The runner's forward; with a drafter that conditions on hidden rows, the model reports its tap layers, and
        where a sequence asks for its prompt's log-probabilities, its last layer's (the final-normed rows) too."""
        taps = getattr(self.drafter, "tap_layers", ())
        model = getattr(self.runner, "model", None)
        scored = prompt_rows(batch)
        if scored:
            taps = (*taps, model.args.num_layers - 1)  # the last: the drafter reads its own taps, which come first
        if not taps or model is None:
            return self.runner.run(batch)
        model.tap_layers = taps
        try:
            out = self.runner.run(batch)
            if scored:
                score_prompts(model, model.last_taps[-1], scored)
                model.last_taps = model.last_taps[:-1] or None  # the drafter's own, as it reads them
            return out
        finally:
            model.tap_layers = ()  # the model may serve other runtimes (a benchmark's modes): they compute no taps

    def _record(self, batch: StepBatch, kept: list[int] | None = None) -> None:
        """Hands a drafter that conditions on the model's hidden rows (DFlash) the rows each sequence keeps."""
        record = getattr(self.drafter, "record", None)
        if record is not None:
            segs = batch.segments
            record(batch.scheduled, [s.start for s in segs], [s.q_start for s in segs], kept)

    def _can_look_ahead(self, prev: Launched) -> bool:
        """The next step would schedule exactly `prev`'s sequences, one token each, none finishing by length."""
        if not prev.decode or self.scheduler.waiting or len(self.scheduler.running) != len(prev.samplers):
            return False
        if not self.runner.accepts_device_tokens(len(prev.samplers)):
            return False
        if _wants_logprobs(prev.samplers):  # their numbers are read with the step's ids
            return False
        if any(seq.guide is not None for seq in prev.samplers):  # the next mask follows this step's token
            return False
        # no sequence may draft next step (`_drafting`): too many, or no rows left for drafts
        drafting = self._drafting(len(prev.samplers), sum(map(_draftable, prev.samplers)))
        for seq in prev.samplers:
            if seq.status is not Status.RUNNING or seq.num_uncached != 0:
                return False
            if drafting and _draftable(seq) and self.drafter.may_draft(seq):
                return False  # its next step may verify drafts, which need this step's token on the host
            if len(seq.generated) + 2 > seq.sampler.params.max_tokens or len(seq.token_ids) + 2 > seq.max_len:
                return False  # prev's token may end it by length: leave that step to the scheduler
        return True

    def _launch_ahead(self, prev: Launched) -> Launched | None:
        seqs = prev.samplers
        segments = self.cache.declare_step([(seq.slot, 1) for seq in seqs])
        positions = torch.tensor([s.start for s in segments], dtype=torch.long)
        batch = StepBatch(
            tokens=torch.zeros(len(seqs), dtype=torch.long),  # unknown yet: the device holds them
            positions=positions,
            segments=segments,
            logit_rows=torch.arange(len(seqs)),
            scheduled=[(seq, 1) for seq in seqs],
            samplers=list(seqs),
            device_tokens=prev.ids,
        )
        ids, _ = self._forward(batch, ahead=True)  # no sequence of a look-ahead step asks for log-probabilities
        self.lookahead_steps += 1
        return Launched(list(seqs), ids, *_to_host(ids, self.runner), True)

    # -- reading the ids
    def _resolve(self, launched: Launched) -> list[tuple[Sequence, int]]:
        tokens = launched.tokens()  # the one wait for the device
        logprobs = launched.logprobs or [[]] * len(tokens)
        out = []
        for seq, new, lps in zip(launched.samplers, tokens, logprobs):
            if seq.status is not Status.RUNNING:  # finished after this step was queued: drop its token
                continue
            seq.num_steps += 1
            seq.step_logprobs = []
            for j, token in enumerate(new):
                seq.append(token, draft=j < len(new) - 1)  # a verify step's tokens: its kept drafts, then its own
                if seq.guide is not None:
                    seq.guide.advance(token)
                if lps:
                    seq.step_logprobs.append(lps[j])
                out.append((seq, token))
                reason = finish_reason(seq, token)
                if reason:
                    self._drop_past_end(seq)
                    self.scheduler.finish(seq, reason, self.release_on_finish)
                    break
        return out

    def _drop_past_end(self, seq: Sequence) -> None:
        """A verify step that ends a sequence mid-draft cached accepted drafts after its end: they go."""
        if seq.slot is not None and seq.num_cached >= len(seq.token_ids):
            seq.num_cached = len(seq.token_ids) - 1
            self.cache.rewind(seq.slot, seq.num_cached)


@contextmanager
def _shaped(logits: torch.Tensor, seqs: list[Sequence], rows_of: list[int] | None = None) -> Iterator[bool]:
    """While the step samples: each sampler's logit bias added to its rows, then the rows of samplers with a grammar
    (engine/constraint) masked to the tokens it allows, in place; yields whether any row changed (the step's graph
    argmax then serves none; the sampling graphs read the changed rows). The logits are the model's again after where
    log-probabilities are asked. Sampler i owns `rows_of[i]` rows (default one): its drafts' rows, each masked as its
    grammar stands after the drafts before it (as plain decoding would mask that position)."""
    counts = rows_of or [1] * len(seqs)
    starts = list(accumulate(counts, initial=0))
    biased = [i for i, seq in enumerate(seqs) if seq.sampler.params.logit_bias]
    guided = [i for i, seq in enumerate(seqs) if seq.guide is not None]
    if not biased and not guided:
        yield False
        return
    keep = _wants_logprobs(seqs)
    undo = []
    try:
        if biased:
            undo.append(bias_rows(logits, [(starts[i], counts[i]) for i in biased],
                                  [seqs[i].sampler.params.logit_bias for i in biased], keep))
        if guided:
            undo.append(mask_rows(logits, [starts[i] for i in guided], [seqs[i].guide for i in guided], keep,
                                  [seqs[i].draft[:counts[i] - 1] for i in guided]))
        yield True
    finally:
        for restore in reversed(undo):
            restore()


def _wants_logprobs(seqs: list[Sequence]) -> bool:
    return any(s.sampler.params.logprobs is not None for s in seqs)


def _logprobs(logits: torch.Tensor, seqs: list[Sequence], chosen: list[list[int]],
              rows_of: list[int] | None = None) -> list[list[TokenLogprob]] | None:
    """Per sampler, the log-probabilities of its `chosen` tokens where its params ask (else []). Sampler i owns
    `rows_of[i]` rows of the logits in order (default one; a verify step's drafts + 1), its tokens the first ones."""
    if not _wants_logprobs(seqs):
        return None
    rows, tokens, tops, spans, at = [], [], [], [], 0
    for i, (seq, new) in enumerate(zip(seqs, chosen)):
        top = seq.sampler.params.logprobs
        spans.append((len(rows), len(new) if top is not None else 0))
        if top is not None:
            rows += range(at, at + len(new))
            tokens += new
            tops += [top] * len(new)
        at += rows_of[i] if rows_of is not None else 1
    found = row_logprobs(logits, rows, tokens, tops)
    return [found[start : start + n] for start, n in spans]


def _trim_drafts(seqs: list[Sequence], keep: int) -> None:
    """Drops drafted tokens from the ends of the longest drafts until `keep` are left in all; a draft's first
    tokens, the likeliest kept, go last."""
    extra = sum(len(s.draft) for s in seqs) - keep
    while extra > 0:
        longest = max(seqs, key=lambda s: len(s.draft))
        longest.draft = longest.draft[:-1]
        extra -= 1


def _draftable(seq: Sequence) -> bool:
    return seq.sampler.params.speculative  # a guided row's drafts are verified under the masks they lead to


def _draft_room(seq: Sequence, step_tokens: int) -> int:
    """Drafts that fit: the answer's token limit (the token after them counts too), the context, one step's rows."""
    left = seq.sampler.params.max_tokens - len(seq.generated) - 1
    return max(0, min(left, seq.max_len - len(seq.token_ids), step_tokens - 1))


def finish_reason(seq: Sequence, token: int) -> str | None:
    if token in seq.stop_ids or (seq.guide is not None and seq.guide.finished):  # a grammar complete ends the answer
        return "stop"
    if len(seq.generated) >= seq.sampler.params.max_tokens:
        return "length"
    if len(seq.token_ids) >= seq.max_len:
        return "context_full"
    return None
