"""Engine: the thread that owns the models and the device, fed by a command queue, answering with events.

Any thread may call the public methods; they only enqueue a command (ids are handed out at once).
The engine thread loads models itself (GPU backends bind per-thread stream state while initialising)
and then loops: drain commands, run one step per model that has work, emit events.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from engine import events as ev
from engine.backend import resolve_device
from engine.errors import CacheError, ParleyError
from engine.loading.loader import LoadOptions, load_model
from engine.remote import RemoteModel, RemoteModels
from engine.runtime import EngineConfig, ModelRuntime
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence, Status
from engine.session import OVERFLOW_POLICIES, Session, Turn, common_prefix, render_turn
from engine.text_stream import TextStream

EventSink = Callable[[ev.Event], None]
CONTINUE_CONTEXT = 8  # ids before a continued answer's new text that its detokeniser starts from


class Engine:
    def __init__(self, config: EngineConfig | None = None, on_event: EventSink | None = None):
        self.config = config or EngineConfig()
        self.events: queue.Queue[ev.Event] = queue.Queue()
        self._sink = on_event or self.events.put
        self._commands: queue.Queue[tuple[Callable, tuple]] = queue.Queue()
        self._ids = itertools.count(1)  # session, turn and model ids: monotonic, never reused
        self._id_lock = threading.Lock()
        self._models: dict[int, ModelRuntime] = {}
        self._sessions: dict[int, Session] = {}
        self._remote = RemoteModels(self._sessions, self._put, self._emit)  # models behind an HTTP endpoint
        self._thread: threading.Thread | None = None
        self._stopping = False

    # -- lifecycle (caller's thread)
    def start(self) -> "Engine":
        self._thread = threading.Thread(target=self._loop, name="parley-engine", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Ends every running turn (reason `closed`) and stops the thread."""
        self._put(self._shutdown)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- commands (caller's thread): each returns at once
    def load_model(self, source: str | Path) -> int:
        model_id = self._new_id()
        self._put(self._load, model_id, Path(source))
        return model_id

    def add_remote_model(self, base_url: str, model: str | None = None, api_key: str | None = None,
                         timeout: float = 60.0) -> int:
        """A model on an OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp...): sessions on it use the same
        commands and events (TokenDelta without token ids). Ends with ModelLoaded(info["remote"]=True) or ModelFailed."""
        model_id = self._new_id()
        self._remote.add(model_id, RemoteModel(base_url, model, api_key, timeout))
        return model_id

    def open_session(
        self,
        model_id: int,
        system_prompt: str | None = None,
        params: SamplingParams | None = None,
        overflow: str = "stop",
        raw: bool = False,
    ) -> int:
        """A new conversation; `raw` makes it a plain-text completion (BOS + text, no chat template)."""
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}")
        sid = self._new_id()
        self._put(self._open, sid, model_id, system_prompt, params or SamplingParams(), overflow, raw)
        return sid

    def submit(self, session_id: int, text: str) -> int:
        """A user turn; the answer streams back as TokenDelta events and ends with Finished or Error."""
        turn_id = self._new_id()
        self._put(self._submit, session_id, turn_id, text)
        return turn_id

    def regenerate(self, session_id: int) -> int:
        """Answers the last user message again (the previous answer is dropped from the conversation)."""
        turn_id = self._new_id()
        self._put(self._regenerate, session_id, turn_id)
        return turn_id

    def continue_answer(self, session_id: int) -> int:
        """Generates more of the last answer (one stopped, cut short by its length or by a crash). The new
        text streams as TokenDelta events; Finished carries the whole answer."""
        turn_id = self._new_id()
        self._put(self._continue, session_id, turn_id)
        return turn_id

    def cancel(self, session_id: int) -> None:
        self._put(self._cancel, session_id)

    def fork(self, session_id: int, at_message: int | None = None) -> int:
        """A new session holding messages[:at_message] of this one (all when None), sharing its cache prefix."""
        sid = self._new_id()
        self._put(self._fork, sid, session_id, at_message)
        return sid

    def rewind(self, session_id: int, to_message: int) -> None:
        """Keeps messages[:to_message]; the cache is trimmed to match at the next turn (edit / branch)."""
        self._put(self._rewind, session_id, to_message)

    def set_params(self, session_id: int, params: SamplingParams) -> None:
        self._put(self._set_params, session_id, params)

    def set_system_prompt(self, session_id: int, text: str | None) -> None:
        self._put(self._set_system, session_id, text)

    def set_messages(self, session_id: int, messages: list[dict[str, str]]) -> None:
        """Replaces an idle session's conversation (user/assistant messages, no system message)."""
        self._put(self._set_messages, session_id, [dict(m) for m in messages])

    def close(self, session_id: int) -> None:
        self._put(self._close, session_id)

    def call(self, fn: Callable[["Engine"], Any], timeout: float = 60.0) -> Any:
        """Runs fn(engine) on the engine thread and returns its result (introspection, tests)."""
        future: Future = Future()
        self._put(lambda: future.set_result(fn(self)))
        return future.result(timeout)

    def _new_id(self) -> int:
        with self._id_lock:
            return next(self._ids)

    def _put(self, fn: Callable, *args) -> None:
        self._commands.put((fn, args))

    # -- the engine thread
    def _loop(self) -> None:
        while not self._stopping:
            busy = any(rt.has_work() for rt in self._models.values())
            self._drain(block=not busy)
            for rt in list(self._models.values()):
                if rt.has_work() and not self._stopping:
                    self._step(rt)
        for rt in self._models.values():
            rt.close()  # device state is released by the thread that owns it
        self._models.clear()

    def _drain(self, block: bool) -> None:
        try:
            item = self._commands.get(timeout=0.05) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        self._settle()  # commands change sequences: no step may be queued ahead of them
        while True:
            fn, args = item
            self._run_command(fn, args)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return

    def _run_command(self, fn: Callable, args: tuple) -> None:
        try:
            fn(*args)
        except ParleyError as exc:
            self._emit(ev.Error(_session_arg(fn, args), None, str(exc)))
        except Exception as exc:  # a bug in one command must not take the engine down
            self._emit(ev.Error(_session_arg(fn, args), None, f"Internal error: {exc!r}"))

    def _emit(self, event: ev.Event) -> None:
        try:
            self._sink(event)
        except Exception:
            pass  # a failing listener must not stop generation for everyone

    # -- command handlers (engine thread)
    def _load(self, model_id: int, source: Path) -> None:
        c = self.config
        try:
            device, dtype = resolve_device(c.device, c.dtype)
        except ParleyError as exc:
            self._emit(ev.ModelFailed(None, model_id, str(exc)))
            return
        options = LoadOptions(device=device, dtype=dtype, cache_dir=c.cache_dir)

        def progress(stage: str, fraction: float) -> None:
            self._emit(ev.ModelProgress(None, model_id, stage, fraction))

        try:
            lm = load_model(source, options, progress)
            rt = ModelRuntime(model_id, lm, c)
        except ParleyError as exc:
            self._emit(ev.ModelFailed(None, model_id, str(exc)))
            return
        except Exception as exc:
            self._emit(ev.ModelFailed(None, model_id, f"Could not load {source.name}: {exc!r}"))
            return
        self._models[model_id] = rt
        self._emit(ev.ModelLoaded(None, model_id, lm.name, rt.info()))

    def _open(self, sid: int, model_id: int, system: str | None, params: SamplingParams, overflow: str, raw: bool) -> None:
        device = "cpu" if self._remote.has(model_id) else next(self._runtime(model_id).lm.model.parameters()).device
        sampler = SamplerState(params, device)
        self._sessions[sid] = Session(sid, model_id, params, sampler, system, overflow, raw)

    def _submit(self, sid: int, turn_id: int, text: str) -> None:
        session = self._idle_session(sid, turn_id)
        if session is None:
            return
        session.messages.append({"role": "user", "content": text})
        if not self._try_start_turn(session, turn_id):
            session.messages.pop()  # the failed message is not left in the conversation

    def _regenerate(self, sid: int, turn_id: int) -> None:
        session = self._idle_session(sid, turn_id)
        if session is None:
            return
        if session.messages and session.messages[-1]["role"] == "assistant":
            session.messages.pop()
        if not session.messages:
            self._emit(ev.Error(sid, turn_id, "There is no message to answer."))
            return
        self._try_start_turn(session, turn_id)

    def _continue(self, sid: int, turn_id: int) -> None:
        session = self._idle_session(sid, turn_id)
        if session is None:
            return
        last = session.messages[-1] if session.messages else None
        if last is None or last["role"] != "assistant" or not last["content"]:
            self._emit(ev.Error(sid, turn_id, "There is no answer to continue."))
        elif self._remote.has(session.model_id):
            self._emit(ev.Error(sid, turn_id, "Continuing an answer needs a local model; regenerate it instead."))
        else:
            self._try_start_turn(session, turn_id, continues=True)

    def _try_start_turn(self, session: Session, turn_id: int, continues: bool = False) -> bool:
        """Starts a turn; any failure ends it with an Error event instead of leaving the chat busy."""
        try:
            return self._start_turn(session, turn_id, continues)
        except Exception as exc:
            session.turn = None
            message = str(exc) if isinstance(exc, ParleyError) else f"Could not start the answer: {exc!r}"
            self._emit(ev.Error(session.session_id, turn_id, message))
            return False

    def _cancel(self, sid: int) -> None:
        session = self._session(sid)
        if session.turn is not None and self._remote.has(session.model_id):
            self._remote.end_turn(session, "cancelled")
        elif session.turn is not None:
            self._runtime(session.model_id).scheduler.finish(session.seq, "cancelled", release=False)
            self._end_turn(session, "cancelled")

    def _fork(self, new_sid: int, sid: int, at: int | None) -> None:
        src = self._session(sid)
        msgs = src.messages[: len(src.messages) if at is None else at]
        child = Session(new_sid, src.model_id, src.params, src.sampler.fork(), src.system_prompt, src.overflow, src.raw, list(msgs))
        rt = self._models.get(src.model_id)  # None for a remote model
        if rt is not None and src.seq is not None and src.seq.slot is not None and rt.cache.book.free_slots:
            cached = src.cached_ids()
            child.seq = Sequence(new_sid, list(cached), child.sampler, rt.lm.tokenizer.stop_ids, rt.limit)
            child.seq.slot = rt.cache.seq_clone(src.seq.slot)
            child.seq.num_cached = len(cached)
            child.seq.status = Status.FINISHED
        self._sessions[new_sid] = child

    def _rewind(self, sid: int, to: int) -> None:
        session = self._session(sid)
        if session.turn is not None:
            self._cancel(sid)
        if not 0 <= to <= len(session.messages):
            raise ParleyError(f"Cannot rewind to message {to}: the chat has {len(session.messages)}.")
        del session.messages[to:]

    def _set_params(self, sid: int, params: SamplingParams) -> None:
        session = self._session(sid)
        session.params = params
        session.sampler.update(params)

    def _set_system(self, sid: int, text: str | None) -> None:
        self._session(sid).system_prompt = text

    def _set_messages(self, sid: int, messages: list[dict[str, str]]) -> None:
        session = self._session(sid)
        if session.turn is not None:
            raise ParleyError("This chat is still answering; stop it or wait for it to finish.")
        if any(m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str) for m in messages):
            raise ParleyError("Chat messages must be user or assistant messages with text content.")
        session.messages = messages

    def _close(self, sid: int) -> None:
        session = self._sessions.get(sid)
        if session is None:
            return
        rt = self._models.get(session.model_id)
        if session.turn is not None and self._remote.has(session.model_id):
            self._remote.end_turn(session, "closed")
        if session.turn is not None and rt is not None:
            rt.scheduler.finish(session.seq, "closed", release=False)
            self._end_turn(session, "closed")
        if session.seq is not None and rt is not None:
            rt.scheduler.release(session.seq)
        del self._sessions[sid]

    def _shutdown(self) -> None:
        for sid in list(self._sessions):
            self._close(sid)
        self._stopping = True

    # -- turns
    def _start_turn(self, session: Session, turn_id: int, continues: bool = False) -> bool:
        """Raises (ParleyError with the reason) when the turn cannot start; _try_start_turn reports it."""
        if self._remote.has(session.model_id):
            self._remote.start_turn(session, turn_id)
            return True
        rt = self._runtime(session.model_id)
        tok = rt.lm.tokenizer
        ids, dropped = render_turn(session, tok, rt.limit, continue_final=continues)
        seq = self._prepare_sequence(session, rt, ids)
        context = ids[-CONTINUE_CONTEXT:] if continues else ()  # the new text decodes as it would after the old
        session.turn = Turn(turn_id, TextStream(tok, session.params.stop, context))
        session.turn.continues = session.messages[-1]["content"] if continues else None
        session.turn.prompt_tokens = len(ids)
        session.turn.prefilled_tokens = len(ids) - seq.num_cached
        session.turn.dropped_messages = dropped
        session.last_used = time.monotonic()
        rt.scheduler.resume(seq)
        self._emit(ev.Started(session.session_id, turn_id))
        self._emit(ev.ContextUsage(session.session_id, len(ids), rt.limit, dropped))
        return True

    def _prepare_sequence(self, session: Session, rt: ModelRuntime, ids: list[int]) -> Sequence:
        """Reuses the cached prefix: only tokens after the common prefix are prefilled."""
        keep = min(common_prefix(ids, session.cached_ids()), len(ids) - 1)  # the last token must run for logits
        seq = session.seq
        if seq is None:
            seq = session.seq = Sequence(session.session_id, [], session.sampler, rt.lm.tokenizer.stop_ids, rt.limit)
        if seq.slot is not None and keep < seq.num_cached:
            try:
                rt.cache.rewind(seq.slot, keep)
                seq.num_cached = keep
            except CacheError:  # rewinding past a sliding-window ring: prefill again from scratch
                rt.scheduler.release(seq)
        seq.token_ids = list(ids)
        seq.generated, seq.num_prompt, seq.finish_reason = [], len(ids), None
        seq.sampler, seq.max_len = session.sampler, rt.limit
        return seq

    def _step(self, rt: ModelRuntime) -> None:
        self._make_room(rt)
        self._deliver(rt, rt.batcher.step)
        self._report_queue(rt)

    def _settle(self) -> None:
        """Reads every step launched ahead (look-ahead decoding) and streams its tokens."""
        for rt in list(self._models.values()):
            if rt.batcher is not None and rt.batcher.has_ahead():
                self._deliver(rt, rt.batcher.settle)

    def _deliver(self, rt: ModelRuntime, run: Callable[[], list]) -> None:
        try:
            results = run()
        except Exception as exc:
            self._fail_step(rt, exc)
            return
        for seq, token in results:
            self._on_token(rt, self._sessions[seq.seq_id], seq, token)

    def _on_token(self, rt: ModelRuntime, session: Session, seq: Sequence, token: int) -> None:
        turn = session.turn
        if turn.first_token_at is None:
            turn.first_token_at = time.perf_counter()
        text = "" if token in seq.stop_ids else turn.stream.push(token)
        self._emit(ev.TokenDelta(session.session_id, turn.turn_id, [token], text))
        if turn.stream.stopped and seq.status is not Status.FINISHED:
            rt.scheduler.finish(seq, "stop_string", release=False)
        if seq.status is Status.FINISHED:
            self._end_turn(session, seq.finish_reason or "stop")

    def _end_turn(self, session: Session, reason: str) -> None:
        turn, seq = session.turn, session.seq
        tail = turn.stream.finish()
        if tail:
            self._emit(ev.TokenDelta(session.session_id, turn.turn_id, [], tail))
        text = turn.stream.text
        if turn.continues is not None:  # the answer grows in place; Finished carries all of it
            text = session.messages[-1]["content"] = turn.continues + text
        elif text or reason not in ("cancelled", "closed"):
            session.messages.append({"role": "assistant", "content": text})
        rt = self._models[session.model_id]
        self._emit(ev.Finished(session.session_id, turn.turn_id, reason, text, self._stats(turn, seq, rt)))
        session.turn = None
        session.last_used = time.monotonic()

    def _stats(self, turn: Turn, seq: Sequence, rt: ModelRuntime) -> ev.TurnStats:
        now = time.perf_counter()
        n = len(seq.generated)
        first = turn.first_token_at
        rate = (n - 1) / (now - first) if first is not None and n > 1 and now > first else None
        return ev.TurnStats(
            prompt_tokens=turn.prompt_tokens,
            prefilled_tokens=turn.prefilled_tokens,
            completion_tokens=n,
            ttft_s=None if first is None else first - turn.submitted_at,
            tokens_per_s=rate,
            context_used=len(seq.token_ids),
            context_limit=rt.limit,
        )

    def _fail_step(self, rt: ModelRuntime, exc: Exception) -> None:
        """A failed forward ends the turns of the sequences in it; every other session keeps going."""
        message = str(exc) if isinstance(exc, ParleyError) else f"Generation failed: {exc!r}"
        for seq in rt.batcher.in_flight:
            session = self._sessions.get(seq.seq_id)
            rt.scheduler.finish(seq, "error", release=True)  # its cache rows may be half written
            if session is not None and session.turn is not None:
                turn = session.turn
                session.turn = None
                self._emit(ev.Error(session.session_id, turn.turn_id, message))
        rt.batcher.in_flight = []

    def _make_room(self, rt: ModelRuntime) -> None:
        """Evicts the cache of idle sessions (least recently used first) while turns wait for a slot."""
        waiting = len(rt.scheduler.waiting)
        if not waiting or rt.cache.book.free_slots >= waiting:
            return
        idle = sorted(
            (s for s in self._sessions.values()
             if s.model_id == rt.model_id and s.turn is None and s.seq is not None and s.seq.slot is not None),
            key=lambda s: s.last_used,
        )
        for session in idle[: waiting - rt.cache.book.free_slots]:
            rt.scheduler.release(session.seq)

    def _report_queue(self, rt: ModelRuntime) -> None:
        for position, seq in enumerate(rt.scheduler.waiting):
            session = self._sessions.get(seq.seq_id)
            if session is not None and session.turn is not None and session.turn.queued_position != position:
                session.turn.queued_position = position
                self._emit(ev.Queued(session.session_id, session.turn.turn_id, position))

    # -- lookups
    def _runtime(self, model_id: int) -> ModelRuntime:
        if model_id not in self._models:
            raise ParleyError(f"Model {model_id} is not loaded (it may still be loading, or it failed to load).")
        return self._models[model_id]

    def _session(self, sid: int) -> Session:
        if sid not in self._sessions:
            raise ParleyError(f"Chat session {sid} does not exist (it was closed or never opened).")
        return self._sessions[sid]

    def _idle_session(self, sid: int, turn_id: int) -> Session | None:
        session = self._sessions.get(sid)
        if session is None:
            self._emit(ev.Error(sid, turn_id, f"Chat session {sid} does not exist (it was closed or never opened)."))
            return None
        if session.turn is not None:
            self._emit(ev.Error(sid, turn_id, "This chat is still answering; stop it or wait for it to finish."))
            return None
        return session


def _session_arg(fn: Callable, args: tuple) -> int | None:
    """The session a failed command was about, so its error reaches the right chat."""
    name = getattr(fn, "__name__", "")
    if name in ("_open", "_fork"):
        return args[0]
    if name in ("_submit", "_regenerate", "_cancel", "_rewind", "_set_params", "_set_system", "_set_messages", "_close"):
        return args[0]
    return None
