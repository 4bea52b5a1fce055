"""LocalHost: the turns of the sessions on one local model, over its ModelRuntime.

A turn renders its messages to token ids, keeps the prefix the session's cache already holds, and runs
as a Sequence; tokens stream back as events until the sequence finishes.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from functools import partial
from typing import Callable

from engine import events as ev
from engine.cache.growth import allocation_failed
from engine.constraint.guide import Guide
from engine.errors import CacheMemoryError, ParleyError
from engine.host import Emit
from engine.logit_bias import check_bias_ids
from engine.logprobs import NamedLogprob, named
from engine.prompt_worker import PromptWorkers
from engine.runtime import ModelRuntime
from engine.sequence import Sequence, Status
from engine.session import Session, Turn, TurnRequest, as_prompted, common_prefix, render_turn
from engine.text_stream import TextStream

log = logging.getLogger(__name__)

OUT_OF_MEMORY = ("Generation failed: the memory ran out during this answer; free some memory, close other chats or "
                 "choose a smaller model.")
CONTINUE_CONTEXT = 8  # ids before a continued answer's new text that its detokeniser starts from


def _prepare_turn(request: TurnRequest, raw: bool, overflow: str, rt: ModelRuntime,
                  resume: int) -> tuple[list[int], int, Guide | None]:
    """On a prompt worker: the turn's ids and dropped messages (`render_turn`), and its grammar's guide if it has one
    (the model's grammar tokenizer is built here the first time, off the engine thread)."""
    ids, dropped = render_turn(request, raw, overflow, rt.lm.tokenizer, rt.limit, resume)
    wrong_ids = check_bias_ids(request.params.logit_bias, rt.lm.args.vocab_size)
    if wrong_ids:
        raise ParleyError(wrong_ids)
    if request.params.prompt_logprobs is not None and rt.backend == "mlx":
        raise ParleyError("The prompt's log-probabilities are not available on the MLX backend.")
    grammar = request.params.grammar
    return ids, dropped, rt.grammars.guide(grammar) if grammar is not None else None


class LocalHost:
    def __init__(self, runtime: ModelRuntime, emit: Emit, post: Callable[..., None] | None = None,
                 workers: PromptWorkers | None = None):
        self.runtime, self.model_id, self._emit = runtime, runtime.model_id, emit
        self._sessions: dict[int, Session] = {}  # the sessions whose sequences run here, by seq id
        self._post = post  # runs a function on the engine thread; None: prompts render inline (tools, tests)
        self._workers = workers
        self._queued: dict[int, Session] = {}  # sessions whose turn was reported queued, by id, until it has a slot
        runtime.spare_idle = self._spare_idle  # a prefix copy may take an idle session's slot (engine/prefix_cache.py)

    def info(self) -> dict:
        return self.runtime.info()

    # -- turns
    def start_turn(self, session: Session, turn_id: int, request: TurnRequest) -> None:
        """Marks the chat busy and renders its prompt on a worker; generation starts back on the engine thread."""
        rt = self.runtime
        session.begin(request)
        continued = request.messages[-1]["content"] if request.continue_final else None
        session.turn = turn = Turn(turn_id, None, continues=continued)  # no stream yet: its prompt is rendering
        session.last_used = time.monotonic()
        job = partial(_prepare_turn, request, session.raw, session.overflow, rt, session.resume_at(request))
        if self._post is None or self._workers is None:
            self._begin_generation(session, turn, request, job())
            return
        self._workers.submit(job, lambda result, exc: self._post(self._rendered, session, turn, request, result, exc))

    def _rendered(self, session: Session, turn: Turn, request: TurnRequest, result, exc: BaseException | None) -> None:
        if session.turn is not turn:
            return  # cancelled or closed while its prompt rendered
        try:
            if exc is not None:
                raise exc if isinstance(exc, Exception) else RuntimeError(f"prompt worker stopped: {exc!r}")
            self._begin_generation(session, turn, request, result)
        except Exception as failure:  # noqa: BLE001 - this turn fails alone
            session.turn = None
            message = str(failure) if isinstance(failure, ParleyError) else f"Internal error: {failure!r}"
            self._emit(ev.Error(session.session_id, turn.turn_id, message, getattr(failure, "code", None)))

    def _begin_generation(self, session: Session, turn: Turn, request: TurnRequest,
                          rendered: tuple[list[int], int, Guide | None]) -> None:
        rt = self.runtime
        ids, dropped, guide = rendered
        session.remember_cut(request, dropped)
        seq = self._prepare_sequence(session, ids)
        seq.guide, seq.group = guide, request.group
        context = ids[-CONTINUE_CONTEXT:] if turn.continues is not None else ()  # new text decodes as it would after the old
        if turn.continues is not None:
            turn.continues = as_prompted(turn.continues, rt.lm.tokenizer.decode(context))
        opened = "" if turn.continues is not None or session.raw else rt.lm.tokenizer.opened_thought(ids)
        turn.stream = TextStream(rt.lm.tokenizer, request.params.stop, context, opened)
        turn.prompt_tokens, turn.prefilled_tokens, turn.dropped_messages = len(ids), len(ids) - seq.num_cached, dropped
        self._sessions[session.session_id] = session
        rt.scheduler.stamp(seq, turn.submitted_at)  # a turn waiting for a slot keeps its place among those sent before
        rt.run(seq)
        self._emit(ev.Started(session.session_id, turn.turn_id))
        self._emit(ev.ContextUsage(session.session_id, len(ids), rt.limit, dropped))

    def _prepare_sequence(self, session: Session, ids: list[int]) -> Sequence:
        """Reuses the longest cached prefix, its own or any other slot's of this model (engine/prefix_cache.py):
        only the tokens after it are prefilled."""
        rt = self.runtime
        keep = min(common_prefix(ids, session.cached_ids()), len(ids) - 1)  # the last token must run for logits
        if session.sampler.params.prompt_logprobs is not None:
            keep = 0  # every prompt position runs: its cached keys and values have no hidden rows to score it by
        seq = session.seq
        if seq is None:
            seq = session.seq = Sequence(session.session_id, [], session.sampler, rt.lm.tokenizer.stop_ids, rt.limit)
        rt.keep_prefix(seq, keep)
        seq.new_turn(ids)
        seq.sampler, seq.max_len = session.sampler, rt.limit
        rt.reuse_prefix(seq, ids, self._live_prefixes(seq))
        rt.follow(seq, [s.seq for s in self._sessions.values() if s is not session and s.seq is not None])
        return seq

    def _live_prefixes(self, seq: Sequence) -> list[tuple[int, list[int]]]:
        """(slot, cached tokens) of every other session's slot: prefixes a turn of `seq` may copy."""
        return [(s.seq.slot, s.seq.token_ids[: s.seq.num_cached]) for s in self._sessions.values()
                if s.seq is not None and s.seq is not seq and s.seq.slot is not None]

    def _copy_prefixes_for_waiting(self) -> None:
        """A waiting turn about to get a slot starts, as a turn that found one free does, from the longest prefix a slot
        holds (a long system prompt every chat shares): admission alone gave it an empty slot to prefill it all again."""
        rt = self.runtime
        if not rt.share_prefixes or rt.batcher.has_ahead():  # a copy must not race a step queued ahead
            return
        for seq in rt.waiting()[: rt.free_slots()]:
            try:
                copied = rt.reuse_prefix(seq, seq.token_ids, self._live_prefixes(seq))
            except CacheMemoryError:
                return  # the memory cannot hold a copy: admission gives it an empty slot, as before
            if seq.slot is not None:
                seq.num_reused = copied
                rt.scheduler.admit(seq)

    def _spare_idle(self, keep: int) -> bool:
        """Frees the least recently used idle session's slot other than `keep` (the prefix about to be copied), as
        `_make_room` would once the turn waited: the turn (or a compare column that waited for another's prefill)
        then copies that prefix instead of prefilling it again."""
        if self.runtime.waiting():
            return False  # turns queued first get the slots idle sessions give up
        idle = [s for s in self._idle_by_age() if s.seq.slot != keep]
        if not idle:
            return False
        self.runtime.release(idle[0].seq)
        return True

    def cancel(self, session: Session) -> None:
        self._stop_turn(session, "cancelled")

    def close(self, session: Session) -> None:
        self._stop_turn(session, "closed")
        if session.seq is not None:
            self.runtime.park(session.seq)  # a later chat may start from its prefix (engine/prefix_cache.py)
        self._sessions.pop(session.session_id, None)

    def _stop_turn(self, session: Session, reason: str) -> None:
        turn = session.turn
        if turn is None:
            return
        if turn.stream is None:  # still rendering: nothing runs yet, its result will be dropped
            session.turn = None
            stats = ev.TurnStats(0, 0, 0, None, None, len(session.cached_ids()), self.runtime.limit)
            self._emit(ev.Finished(session.session_id, turn.turn_id, reason, turn.continues or "", stats))
            return
        self.runtime.stop(session.seq, reason)
        self._end_turn(session, reason)

    def fork(self, source: Session, child: Session) -> None:
        if source.seq is not None:
            child.seq = self.runtime.fork(source.seq, child.session_id)
        if child.seq is not None:
            self._sessions[child.session_id] = child

    # -- steps
    def has_work(self) -> bool:
        return self.runtime.has_work()

    def step(self) -> None:
        self._make_room()
        self._copy_prefixes_for_waiting()
        self._deliver(self.runtime.step)
        refused, self.runtime.refused = self.runtime.refused, []
        for seq, exc in refused:  # its cache could not grow into the memory that is free: the others' step went on
            self._end_with_error(self._sessions.get(seq.seq_id), str(exc), exc.code)
        self._report_queue()

    def settle(self) -> None:
        self._deliver(self.runtime.settle)

    def _deliver(self, run: Callable[[], list]) -> None:
        try:
            results = run()
        except Exception as exc:
            self._fail_step(exc)
            return
        left = Counter(seq for seq, _ in results)  # a verify step brings several tokens of one sequence
        for seq, token in results:
            left[seq] -= 1
            session = self._sessions.get(seq.seq_id)
            if session is None or session.turn is None:  # a stop string ended it on an earlier token of this step
                continue
            try:
                self._on_token(session, seq, token, left[seq])
            except Exception as exc:  # noqa: BLE001 - a fault delivering one chat's token ends that turn alone
                log.exception("delivering a token failed")
                self._fail_turn(session, seq, f"Internal error: {exc!r}")

    def _fail_turn(self, session: Session, seq: Sequence, message: str) -> None:
        if seq.status is not Status.FINISHED:
            self.runtime.stop(seq, "error")
        turn, session.turn = session.turn, None
        self._emit(ev.Error(session.session_id, turn.turn_id, message))

    def _on_token(self, session: Session, seq: Sequence, token: int, after: int = 0) -> None:
        """`after`: tokens of the same step that follow this one (accepted drafts), dropped if this one ends it."""
        turn = session.turn
        first = turn.first_token_at is None
        if first:
            turn.first_token_at = time.perf_counter()
            self._leave_queue(session)  # admitted and prefilled within one step
        text = "" if token in seq.stop_ids else turn.stream.push(token)
        self._emit(ev.TokenDelta(session.session_id, turn.turn_id, [token], text, self._logprobs(seq, token, after),
                                 self._prompt_logprobs(seq) if first else None))
        if turn.stream.stopped and (after or seq.status is not Status.FINISHED):
            self.runtime.stop(seq, "stop_string", drop=after)
            after = 0
        if seq.status is Status.FINISHED and not after:  # else its last tokens of this step are still to come
            # a stop string completed by the last token the answer may have is still the stop string's end
            self._end_turn(session, "stop_string" if turn.stream.stopped else seq.finish_reason or "stop")

    def _logprobs(self, seq: Sequence, token: int, after: int) -> list[NamedLogprob] | None:
        """The token's log-probability entry where the turn asks for them (none for an end-of-turn token: it is no
        text of the answer, and OpenAI lists none for it; but after a scored echo, as vLLM lists it:
        lm-evaluation-harness drops the last entry as the answer's one token, else a prompt token)."""
        lps = seq.step_logprobs
        ended = token in seq.stop_ids and not seq.sampler.params.echo  # every choice's, not only the one scoring
        if seq.sampler.params.logprobs is None or ended or len(lps) <= after:
            return None
        decode = self.runtime.lm.tokenizer.decode
        return [named(lps[len(lps) - 1 - after], lambda t: decode([t]))]

    def _prompt_logprobs(self, seq: Sequence) -> list[NamedLogprob] | None:
        """The prompt's entries, where the turn asks for them: its first token's text alone, then each later token's
        (sent once, so the sequence lets them go)."""
        if not seq.scores_prompt:
            return None
        decode = self.runtime.lm.tokenizer.decode
        found, seq.prompt_logprobs = seq.prompt_logprobs, []
        return [NamedLogprob(decode(seq.token_ids[:1]), None), *(named(lp, lambda t: decode([t])) for lp in found)]

    def _end_turn(self, session: Session, reason: str) -> None:
        turn, seq = session.turn, session.seq
        tail = turn.stream.finish()
        if tail:
            self._emit(ev.TokenDelta(session.session_id, turn.turn_id, [], tail))
        text = turn.stream.text if turn.continues is None else turn.continues + turn.stream.text
        session.turn = None
        session.last_used = time.monotonic()
        self._emit(ev.Finished(session.session_id, turn.turn_id, reason, text, self._stats(turn, seq)))

    def _stats(self, turn: Turn, seq: Sequence) -> ev.TurnStats:
        now = time.perf_counter()
        n = len(seq.generated)
        first = turn.first_token_at
        rate = (n - 1) / (now - first) if first is not None and n > 1 and now > first else None
        return ev.TurnStats(
            prompt_tokens=turn.prompt_tokens,
            prefilled_tokens=turn.prompt_tokens - seq.num_reused,  # what ran: the rest came from a cache
            completion_tokens=n,
            ttft_s=None if first is None else first - turn.submitted_at,
            tokens_per_s=rate,
            context_used=len(seq.token_ids),
            context_limit=self.runtime.limit,
            decode_steps=seq.num_steps,
            drafted_tokens=seq.num_drafted,
            accepted_tokens=seq.num_accepted,
        )

    def _fail_step(self, exc: Exception) -> None:
        """A failed forward ends the turns of the sequences in it; every other session keeps going."""
        if isinstance(exc, ParleyError):
            message = str(exc)
        elif allocation_failed(exc):  # memory taken since the load counted it (another program, a lower limit)
            message = OUT_OF_MEMORY
        else:
            message = f"Generation failed: {exc!r}"
        for seq in self.runtime.fail_in_flight():
            self._end_with_error(self._sessions.get(seq.seq_id), message, getattr(exc, "code", None))

    def _end_with_error(self, session: Session | None, message: str, code: str | None) -> None:
        if session is not None and session.turn is not None:
            turn, session.turn = session.turn, None
            self._emit(ev.Error(session.session_id, turn.turn_id, message, code))

    def _make_room(self) -> None:
        """Evicts the cache of idle sessions (least recently used first) while turns wait for a slot."""
        rt = self.runtime
        short = len(rt.waiting()) - rt.free_slots()
        if short <= 0:
            return
        for session in self._idle_by_age()[:short]:
            rt.release(session.seq)

    def _idle_by_age(self) -> list[Session]:
        """Sessions holding a slot without a turn, least recently used first (the ones to give a slot up)."""
        idle = (s for s in self._sessions.values() if s.turn is None and s.seq is not None and s.seq.slot is not None)
        return sorted(idle, key=lambda s: s.last_used)

    def _report_queue(self) -> None:
        """Each waiting turn's place as it changes; a turn that waited and now has its slot is `Started` again, so
        that the app shows it reading its prompt instead of still queued until its first token."""
        waiting = self.runtime.waiting()
        for position, seq in enumerate(waiting):
            session = self._sessions.get(seq.seq_id)
            if session is not None and session.turn is not None and session.turn.queued_position != position:
                session.turn.queued_position = position
                self._queued[session.session_id] = session
                self._emit(ev.Queued(session.session_id, session.turn.turn_id, position))
        for session in [s for s in self._queued.values() if s.seq not in waiting]:
            self._leave_queue(session)

    def _leave_queue(self, session: Session) -> None:
        """A turn reported queued that has its slot now: `Started` again (before any token of it)."""
        if self._queued.pop(session.session_id, None) is None:
            return
        turn = session.turn
        if turn is not None and turn.queued_position is not None:  # not cancelled meanwhile
            turn.queued_position = None
            self._emit(ev.Started(session.session_id, turn.turn_id))

    def shutdown(self) -> None:
        self.runtime.close()
        self.runtime.spare_idle = None  # the runtime and this host refer to each other: unloaded, both go at once

    def inspect(self) -> dict:
        """Counters for tests and benchmarks (engine thread)."""
        b = self.runtime.batcher
        graphs = getattr(b.runner, "graphs", None)  # CUDA graphs exist only on the GPU runner
        return {"free_slots": self.runtime.free_slots(), "steps": b.steps, "lookahead_steps": b.lookahead_steps,
                "graph_replays": graphs.replays if graphs is not None else 0,
                "cached": {sid: len(s.cached_ids()) for sid, s in self._sessions.items()}}
