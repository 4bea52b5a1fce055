"""Engine: the thread that owns the models and the device, fed by a command queue, answering with events.

Any thread may call the public methods; they only enqueue a command (ids are handed out at once).
The engine thread loads models itself (GPU backends bind per-thread stream state while initialising)
and then loops: drain commands, run one step per model that has work, emit events. Each model sits
behind a ModelHost (local runtime or remote endpoint); the engine keeps the sessions and routes.
"""
from __future__ import annotations

import errno
import itertools
import queue
import signal
import threading
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

from engine import commands as cmd
from engine import events as ev
from engine.backend import resolve_device
from engine.errors import LoadStopped, ParleyError
from engine.host import ModelHost
from engine.loading.default_model import expand_home
from engine.loading.gguf_split import model_file
from engine.loading.loader import LoadOptions, load_model
from engine.local_host import LocalHost
from engine.memory import return_freed_memory
from engine.prompt_worker import PromptWorkers
from engine.remote import RemoteHost, RemoteModel, probe_in_background
from engine.runtime import EngineConfig, build_runtime
from engine.runtime_memory import runtime_parts
from engine.sampling import SamplerState, SamplingParams
from engine.session import OVERFLOW_POLICIES, Session, TurnRequest

EventSink = Callable[[ev.Event], None]


class Engine:
    def __init__(self, config: EngineConfig | None = None, on_event: EventSink | None = None):
        self.config = config or EngineConfig()
        self.events: queue.Queue[ev.Event] = queue.Queue()
        self._sink = on_event or self.events.put
        self._commands: queue.Queue[cmd.Command] = queue.Queue()
        self._ids = itertools.count(1)  # session, turn and model ids: monotonic, never reused
        self._id_lock = threading.Lock()
        self._hosts: dict[int, ModelHost] = {}
        self._sessions: dict[int, Session] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False  # the thread has ended: commands are answered at once (see _refuse)
        self._closed_lock = threading.Lock()
        self._ended = threading.Event()  # the loop has ended (the thread itself may live on: see _loop)
        self._ran_mlx = False  # a model ran on MLX on this engine's thread
        self._workers = PromptWorkers()
        self._loader = PromptWorkers(threads=1, name="parley-load")  # one model read at a time, off the step loop
        self._handlers: dict[type, Callable[[Any], None]] = {
            cmd.LoadModel: self._load, cmd.AddHost: self._add_host, cmd.OpenSession: self._open,
            cmd.StartTurn: self._start_turn, cmd.Cancel: self._cancel, cmd.Fork: self._fork, cmd.Close: self._close,
            cmd.Post: lambda c: c.fn(*c.args), cmd.Call: self._call, cmd.Shutdown: self._shutdown,
            cmd.UnloadModel: self._unload,
        }

    # -- lifecycle (caller's thread)
    def start(self) -> "Engine":
        self._thread = threading.Thread(target=self._loop, name="parley-engine", daemon=True)
        with _signals_blocked(threading.current_thread() is threading.main_thread()):
            self._thread.start()  # it and the threads it starts (prompt workers, the loader, torch's) inherit the mask
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Ends every running turn (reason `closed`) and stops the thread."""
        self._put(cmd.Shutdown())
        if self._thread is not None:
            self._ended.wait(timeout)

    @property
    def running(self) -> bool:
        """True while the engine thread is alive and taking commands."""
        return self._thread is not None and self._thread.is_alive() and not self._ended.is_set()

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- commands (caller's thread): each returns at once
    def unload_model(self, model_id: int) -> None:
        """Frees a model and its cache; its chats' running turns end as "closed" and their sessions close.
        Ends with ModelUnloaded."""
        self._put(cmd.UnloadModel(model_id=model_id))

    def set_draft_model(self, path: Path | None) -> None:
        """Models loaded from now on draft with `path` (a smaller model with the same tokenizer, or a DFlash drafter
        trained for them), or, with None, from their prompts (speculative auto); a model loaded already keeps its
        drafter until it is loaded again."""
        self._put(cmd.Post(fn=self._set_draft, args=(path,)))

    def _set_draft(self, path: Path | None) -> None:
        from engine.speculative.dflash_net import draft_mode

        self.config = replace(self.config, draft_model=path, speculative=draft_mode(path) if path is not None else "auto")

    def load_model(self, source: str | Path) -> int:
        model_id = self._new_id()
        self._put(cmd.LoadModel(model_id=model_id, source=Path(source)))
        return model_id

    def add_remote_model(self, base_url: str, model: str | None = None, api_key: str | None = None,
                         timeout: float = 60.0) -> int:
        """A model on an OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp...): sessions on it use the same
        commands and events (TokenDelta without token ids). Ends with ModelLoaded(info["remote"]=True) or ModelFailed."""
        model_id = self._new_id()
        remote = RemoteModel(base_url, model, api_key, timeout)
        host = RemoteHost(model_id, remote, self._post, self._emit)
        probe_in_background(
            remote,
            lambda info: self._put(cmd.AddHost(model_id=model_id, host=host, name=remote.model, info=info)),
            lambda message: self._post(self._emit, ev.ModelFailed(None, model_id, message)),
        )
        return model_id

    def open_session(self, model_id: int, overflow: str = "stop", raw: bool = False) -> int:
        """A new conversation on a model; `raw` makes it a plain-text completion (BOS + text, no chat template)."""
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}")
        sid = self._new_id()
        self._put(cmd.OpenSession(session_id=sid, model_id=model_id, overflow=overflow, raw=raw))
        return sid

    def submit(self, session_id: int, messages: list[dict[str, str]], params: SamplingParams | None = None,
               system_prompt: str | None = None, continue_final: bool = False,
               tools: list[dict] | None = None, suffix: str | None = None,
               prompt_ids: list[int] | None = None, group: int | None = None) -> int:
        """A turn answering `messages` (user/assistant, ending with the user's; the caller owns the conversation).
        The session's cache keeps what it can of the previous turn's tokens. With `continue_final` the last
        message is an answer to generate more of: the new text streams, Finished carries the whole answer.
        The answer streams back as TokenDelta events and ends with Finished or Error. `tools`: OpenAI's tool objects,
        shown to the model by its chat template (the caller reads the calls back: engine/tool_calls.py). `suffix`, on a
        raw session: the text after the insertion point, the messages' text before it; the model fills in the middle.
        `prompt_ids`, on a raw session with no messages: the whole prompt as token ids, sent to the model as they are.
        `group`: the turns one client sent together (a server request's answers) wait for a slot in turn with other
        clients' turns, rather than all ahead of those sent after them (engine/scheduler.py)."""
        request = TurnRequest(tuple(dict(m) for m in messages), params or SamplingParams(), system_prompt, continue_final,
                              tuple(tools) if tools else None, suffix,
                              tuple(prompt_ids) if prompt_ids is not None else None, group)
        turn_id = self._new_id()
        self._put(cmd.StartTurn(session_id=session_id, turn_id=turn_id, request=request))
        return turn_id

    def cancel(self, session_id: int) -> None:
        self._put(cmd.Cancel(session_id=session_id))

    def fork(self, session_id: int) -> int:
        """A new session on the same model that starts from a copy of this one's cache (where a slot is free)."""
        sid = self._new_id()
        self._put(cmd.Fork(session_id=sid, source_id=session_id))
        return sid

    def close(self, session_id: int) -> None:
        self._put(cmd.Close(session_id=session_id))

    def call(self, fn: Callable[["Engine"], Any], timeout: float = 60.0) -> Any:
        """Runs fn(engine) on the engine thread and returns its result (introspection, tests)."""
        future: Future = Future()
        self._put(cmd.Call(fn=fn, future=future))
        return future.result(timeout)

    def inspect(self, timeout: float = 60.0) -> dict:
        """A snapshot for tests and tools: open sessions, and per local model its free slots and step counters."""
        def snapshot(engine: "Engine") -> dict:
            models = {mid: h.inspect() for mid, h in engine._hosts.items() if isinstance(h, LocalHost)}
            return {"sessions": len(engine._sessions), "models": models}

        return self.call(snapshot, timeout)

    def loaded_model(self, model_id: int, timeout: float = 60.0):
        """The LoadedModel behind a local model id (tests inject faults through it; tools read its args)."""
        return self.call(lambda engine: engine._host(model_id).runtime.lm, timeout)

    def _new_id(self) -> int:
        with self._id_lock:
            return next(self._ids)

    def _put(self, command: cmd.Command) -> None:
        with self._closed_lock:
            if not self._closed:
                self._commands.put(command)
                return
        self._refuse(command)

    def _refuse(self, command: cmd.Command) -> None:
        """After shutdown every command still gets its answer: a turn its Error, a call its exception."""
        message = "The engine has shut down; restart Parley to continue."
        if isinstance(command, cmd.Call):
            command.future.set_exception(ParleyError(message))
            return
        if isinstance(command, cmd.LoadModel):
            event = ev.ModelFailed(None, command.model_id, message)
        elif isinstance(command, cmd.StartTurn):
            event = ev.Error(command.session_id, command.turn_id, message)
        else:
            return
        # never from the caller's own call: it may hold the lock its event listener takes
        threading.Thread(target=self._emit, args=(event,), name="parley-engine-closed", daemon=True).start()

    def _post(self, fn: Callable, *args) -> None:
        self._put(cmd.Post(fn=fn, args=args))

    # -- the engine thread
    def _loop(self) -> None:
        try:
            self._steps()
        finally:
            self._ended.set()
        if self._ran_mlx:
            # MLX keeps its compiled functions (mlx.nn's activations) per thread, and frees them as the thread ends
            # by taking the GIL: with the interpreter exiting by then, that aborted the process ('terminate called
            # without an active exception', exit 134). A thread that never ends never frees them.
            threading.Event().wait()

    def _steps(self) -> None:
        while not self._stopping:
            busy = any(h.has_work() for h in self._hosts.values())
            self._drain(block=not busy)
            self._step_hosts()
        for host in self._hosts.values():
            host.shutdown()  # device state is released by the thread that owns it
        self._hosts.clear()
        self._workers.close()
        self._loader.close()
        with self._closed_lock:
            self._closed = True
        while True:  # commands that arrived while it stopped
            try:
                self._refuse(self._commands.get_nowait())
            except queue.Empty:
                return

    def _step_hosts(self) -> None:
        """One step of each model with work (a function: a loop variable left in `_loop` kept an unloaded model alive)."""
        for host in list(self._hosts.values()):
            if host.has_work() and not self._stopping:
                host.step()

    def _settle_hosts(self) -> None:
        """Commands change sequences: no step may be queued ahead of them. (A function: the loop variable left in
        `_drain` kept a model unloaded by the commands after it alive, its template's cycles frozen by the app's
        collection after the unload, until `_drain` returned.)"""
        for host in list(self._hosts.values()):
            host.settle()

    def _drain(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.05) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        self._settle_hosts()
        while True:
            self._run(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _run(self, command: cmd.Command) -> None:
        try:
            self._handlers[type(command)](command)
        except ParleyError as exc:
            self._emit(ev.Error(command.session_id, command.turn_id, str(exc), exc.code))
        except Exception as exc:  # a bug in one command must not take the engine down
            self._emit(ev.Error(command.session_id, command.turn_id, f"Internal error: {exc!r}"))

    def _call(self, c: cmd.Call) -> None:
        try:
            result = c.fn(self)
        except BaseException as exc:  # noqa: BLE001 - the caller gets it, not the engine
            c.future.set_exception(exc)
        else:
            c.future.set_result(result)

    def _emit(self, event: ev.Event) -> None:
        try:
            self._sink(event)
        except Exception:
            pass  # a failing listener must not stop generation for everyone

    # -- command handlers (engine thread)
    def _load(self, c: cmd.LoadModel) -> None:
        """Reads the model on the loader thread (a big or hostile file must not stall other chats' steps); its
        runtime is built back on the engine thread, which owns the device."""
        self._loader.submit(partial(self._read_model, c), lambda lm, exc: self._post(self._loaded, c, lm, exc))

    def _read_model(self, c: cmd.LoadModel):
        def progress(stage: str, fraction: float) -> None:
            self._unless_stopping()
            self._emit(ev.ModelProgress(None, c.model_id, stage, fraction))

        config = self.config  # one snapshot: set_draft_model may replace it meanwhile
        device, dtype = resolve_device(config.device, config.dtype)
        options = LoadOptions(device=device, dtype=dtype, cache_dir=config.cache_dir, weights=config.weights,
                              quantize=config.quantize, context=config.max_session_tokens,
                              beside=partial(runtime_parts, config))
        lm = load_model(c.source, options, progress)
        if config.speculative == "dflash":
            return lm, self._read_dflash(config.draft_model, lm)
        path = config.draft_model if config.speculative == "draft" else None
        try:
            # the draft model itself, named by the same path or another (a split model's other part, its folder):
            # it drafts from its prompts, not from a second copy of itself
            if path is not None and model_file(expand_home(path)).resolve() == lm.source.resolve():
                return lm, None
            return lm, (load_model(path, options, lambda *_: self._unless_stopping()) if path is not None else None)
        except LoadStopped:
            raise
        except ParleyError as exc:  # the model itself is fine: it drafts from the prompt instead
            lm.notices.append(f"The draft model could not be loaded ({exc}); drafting from the prompt instead.")
            return lm, None

    def _unless_stopping(self) -> None:
        """A load's checkpoint (each tensor, each stage): a process that exits while the loader thread is inside torch
        aborts ('terminate called without an active exception'), so a load stops at once when the engine closes."""
        if self._stopping:
            raise LoadStopped("The model's load stopped: Parley is closing.")

    @staticmethod
    def _read_dflash(path: Path, lm):
        """The DFlash drafter's network, or None (the model drafts from the prompt, with a notice why)."""
        from engine.speculative.dflash_net import load as load_dflash

        try:
            return load_dflash(path)
        except (OSError, ValueError) as exc:
            lm.notices.append(f"The DFlash drafter could not be loaded ({exc}); drafting from the prompt instead.")
            return None

    def _loaded(self, c: cmd.LoadModel, models, exc: BaseException | None) -> None:
        try:
            if exc is not None:
                raise exc
            lm, draft = models
            runtime = build_runtime(lm, self.config, c.model_id, keep_finished=True, draft=draft)
            self._ran_mlx |= runtime.backend == "mlx"
            runtime.warm_up()
        except ParleyError as failure:
            self._emit(ev.ModelFailed(None, c.model_id, str(failure)))
            return
        except Exception as failure:  # noqa: BLE001 - reported as this model's failure
            self._emit(ev.ModelFailed(None, c.model_id, _load_failure(c.source, failure)))
            return
        self._add_host(cmd.AddHost(model_id=c.model_id, host=LocalHost(runtime, self._emit, self._post, self._workers),
                                  name=lm.name))

    def _add_host(self, c: cmd.AddHost) -> None:
        self._hosts[c.model_id] = c.host
        self._emit(ev.ModelLoaded(None, c.model_id, c.name, c.host.info()))

    def _open(self, c: cmd.OpenSession) -> None:
        host = self._host(c.model_id)
        self._sessions[c.session_id] = Session(c.session_id, c.model_id, SamplerState(SamplingParams()),
                                               c.overflow, c.raw)

    def _start_turn(self, c: cmd.StartTurn) -> None:
        session = self._session(c.session_id)
        if session.turn is not None:
            raise ParleyError("This chat is still answering; stop it or wait for it to finish.")
        c.request.check(session.raw)
        try:
            self._host(session.model_id).start_turn(session, c.turn_id, c.request)
        except Exception:
            session.turn = None  # a turn that did not start leaves the chat idle
            raise

    def _cancel(self, c: cmd.Cancel) -> None:
        session = self._session(c.session_id)
        self._host(session.model_id).cancel(session)

    def _fork(self, c: cmd.Fork) -> None:
        src = self._session(c.source_id)
        host = self._host(src.model_id)
        child = Session(c.session_id, src.model_id, src.sampler.fork(), src.overflow, src.raw)
        host.fork(src, child)
        self._sessions[c.session_id] = child

    def _close(self, c: cmd.Close) -> None:
        session = self._sessions.pop(c.session_id, None)
        if session is not None and session.model_id in self._hosts:
            self._hosts[session.model_id].close(session)

    def _unload(self, c: cmd.UnloadModel) -> None:
        host = self._host(c.model_id)
        for sid in [sid for sid, s in self._sessions.items() if s.model_id == c.model_id]:
            self._close(cmd.Close(session_id=sid))
        del self._hosts[c.model_id]
        host.shutdown()
        del host
        return_freed_memory()
        self._emit(ev.ModelUnloaded(None, c.model_id))

    def _shutdown(self, c: cmd.Shutdown) -> None:
        for sid in list(self._sessions):
            self._close(cmd.Close(session_id=sid))
        self._stopping = True

    # -- lookups
    def _host(self, model_id: int) -> ModelHost:
        if model_id not in self._hosts:
            raise ParleyError(f"Model {model_id} is not loaded (it may still be loading, or it failed to load).")
        return self._hosts[model_id]

    def _session(self, sid: int) -> Session:
        if sid not in self._sessions:
            raise ParleyError(f"Chat session {sid} does not exist (it was closed or never opened).")
        return self._sessions[sid]


@contextmanager
def _signals_blocked(wanted: bool) -> Iterator[None]:
    """Termination signals blocked in the threads started inside: the kernel then hands them to the main thread, where
    Python runs their handlers. Taken by the engine thread, a SIGTERM waited for the main thread's next bytecode, which
    never came while it sat in readline (`parley chat` at its prompt did not exit until a key was pressed)."""
    names = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGINT")
    if not wanted or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, n) for n in names if hasattr(signal, n)])
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _load_failure(source: Path, failure: Exception) -> str:
    """The one line of a load that raised: an allocator's refusal (a limit the estimate did not see: `ulimit -v`, a
    GPU shared with another program) says so plainly, anything else names the exception."""
    from engine.cache.growth import allocation_failed

    if allocation_failed(failure) or (isinstance(failure, OSError) and failure.errno == errno.ENOMEM):  # mmap's
        return (f"Could not load {source.name}: the memory ran out while loading it; close other models or "
                "programs, or choose a smaller model or quantization.")
    return f"Could not load {source.name}: {failure!r}"
