"""The one Engine behind the server: loads its models and routes each session's events to an asyncio queue."""
from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from engine import events as ev
from engine.engine import Engine
from engine.errors import ModelLoadError
from engine.loading.gguf_split import model_file, model_name
from engine.runtime import EngineConfig
from engine.tokenizer import Tokenizer


@dataclass(slots=True)
class ServedModel:
    id: str  # what clients put in "model"
    model_id: int  # the engine's id
    context: int  # tokens one request may use (prompt + answer)
    created: int = field(default_factory=lambda: int(time.time()))
    aliases: tuple[str, ...] = ()
    info: dict = field(default_factory=dict)
    tokenizer: Tokenizer | None = None  # a local model's: `echo` writes a token-id prompt as text


class ServerBridge:
    def __init__(self, config: EngineConfig | None = None):
        config = config or EngineConfig()
        self.engine = Engine(config, on_event=self._on_event)
        self._slots = config.max_sessions  # each local model's: a turn started beyond them waits for one
        self.models: list[ServedModel] = []
        self._lock = threading.Lock()  # guards _routes: a session's events wait until its route exists
        self._routes: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._phase: dict[int, str] = {}  # open session -> "queued" / "decoding", from its events (what /health counts)
        self._slot_model: dict[int, int] = {}  # open session -> its local model's id (a remote one has no slots here)
        self._decoding: Counter[int] = Counter()  # local model id -> its sessions counted decoding
        self._model_events: dict[int, ev.Event] = {}
        self._model_cond = threading.Condition()

    def start(self) -> "ServerBridge":
        self.engine.start()
        return self

    def shutdown(self) -> None:
        self.engine.shutdown()

    # -- models (blocking: at start-up)
    def load(self, source: str | Path, alias: str | None = None, timeout: float = 600.0) -> ServedModel:
        """`alias` (the --model spec) and the file's name with and without its extension also name the model: a client
        sent "gemma-3-270m-Q4_K_M" and got 404, the id being the name the file's metadata gives. A split model's name
        without its part number too ("qwen2.5-7b-instruct-q4_k_m" for its -00001-of-00002.gguf)."""
        path = Path(source)
        file = model_file(path)  # a folder's GGUF model (a file, or a split model's parts) answers to its names too
        aliases = (alias, path.name, path.stem, model_name(path), file.name, file.stem, model_name(file))
        served = self._register(self.engine.load_model(source), aliases, timeout)
        served.tokenizer = self.engine.loaded_model(served.model_id, timeout).tokenizer
        return served

    def add_remote(self, base_url: str, model: str | None = None, api_key: str | None = None,
                   timeout: float = 60.0) -> ServedModel:
        return self._register(self.engine.add_remote_model(base_url, model, api_key, timeout), (), timeout + 5)

    def _register(self, model_id: int, aliases: tuple[str | None, ...], timeout: float) -> ServedModel:
        with self._model_cond:
            if not self._model_cond.wait_for(lambda: model_id in self._model_events, timeout):
                raise ModelLoadError(f"The model did not load within {timeout:g} s.")
            e = self._model_events.pop(model_id)
        if isinstance(e, ev.ModelFailed):
            raise ModelLoadError(e.message)
        context = e.info.get("context") or 4096  # a remote endpoint that does not say: its own limit applies
        name = self._unique(e.name)  # two files of one model (two quantisations) must each be reachable
        served = ServedModel(name, model_id, context, aliases=tuple(dict.fromkeys(a for a in aliases if a and a != name)),
                             info=e.info)
        self.models.append(served)
        return served

    def _unique(self, name: str) -> str:
        taken = {m.id for m in self.models} | {a for m in self.models for a in m.aliases}
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name} ({n})"
        return unique

    def slots(self, model: ServedModel) -> int | None:
        """The turns `model` answers at once: a local model's sessions; None for a remote one (its server decides)."""
        return None if model.info.get("remote") else self._slots

    def find(self, name: str) -> ServedModel | None:
        return next((m for m in self.models if name == m.id or name in m.aliases), None)

    # -- sessions (the event loop's thread)
    def open(self, model: ServedModel, raw: bool, queue: asyncio.Queue | None = None) -> tuple[int, asyncio.Queue]:
        """A session whose events go to `queue` (a new one if None: a request's choices share one)."""
        queue = asyncio.Queue() if queue is None else queue
        with self._lock:
            sid = self.engine.open_session(model.model_id, overflow="stop", raw=raw)
            self._routes[sid] = (asyncio.get_running_loop(), queue)
            if not model.info.get("remote"):
                self._slot_model[sid] = model.model_id
        return sid, queue

    def close(self, sid: int) -> None:
        """Ends the session's turn if one is still running (a client that went away) and frees its cache."""
        self.engine.cancel(sid)
        self.engine.close(sid)
        with self._lock:
            self._routes.pop(sid, None)
            self._set_phase(sid, None)
            self._slot_model.pop(sid, None)

    def hold(self, sid: int, held: bool) -> None:
        """Counts a session whose turn the server keeps back (server/choices.py) as queued, or no longer."""
        with self._lock:
            self._set_phase(sid, "queued" if held else None)

    def busy(self) -> dict:
        """What /health says: requests open (a request's choices share one queue), answers decoding and waiting for a
        slot; read from events, never from the engine thread (a question to it waits behind the step in progress)."""
        with self._lock:
            phases = list(self._phase.values())
            open_requests = len({id(queue) for _, queue in self._routes.values()})
        return {"requests": open_requests, "decoding": phases.count("decoding"), "queued": phases.count("queued")}

    # -- the engine thread
    def _track(self, e: ev.Event) -> None:
        sid = e.session_id
        if isinstance(e, ev.Queued):
            self._set_phase(sid, "queued")
        elif isinstance(e, ev.Started) and sid not in self._phase:
            # the engine says Started as it schedules a turn and Queued only after the next step found no slot: a
            # turn started with every slot of its model taken is queued from the first, not decoding for a step
            model = self._slot_model.get(sid)
            free = model is None or self._decoding[model] < self._slots
            self._set_phase(sid, "decoding" if free else "queued")
        elif isinstance(e, (ev.Started, ev.TokenDelta)):  # Started again after Queued: it has its slot
            self._set_phase(sid, "decoding")
        elif isinstance(e, (ev.Finished, ev.Error)):
            self._set_phase(sid, None)

    def _set_phase(self, sid: int, phase: str | None) -> None:
        """The session's phase (None: it has none), and its model's count of sessions decoding (under _lock)."""
        before = self._phase.pop(sid, None) if phase is None else self._phase.get(sid)
        if phase is not None:
            self._phase[sid] = phase
        model = self._slot_model.get(sid)
        if model is not None and (before == "decoding") != (phase == "decoding"):
            self._decoding[model] += 1 if phase == "decoding" else -1

    def _on_event(self, e: ev.Event) -> None:
        if isinstance(e, (ev.ModelLoaded, ev.ModelFailed)):
            with self._model_cond:
                self._model_events[e.model_id] = e
                self._model_cond.notify_all()
            return
        with self._lock:
            route = self._routes.get(e.session_id)
            if route is not None:
                self._track(e)
        if route is not None:
            loop, queue = route
            try:
                loop.call_soon_threadsafe(queue.put_nowait, e)
            except RuntimeError:
                pass  # the loop closed (server shutting down)
