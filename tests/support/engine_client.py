"""A test client for the engine thread: keeps each session's conversation (the caller owns it), collects
events and waits for turns to end."""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from engine import events as ev
from engine.engine import Engine
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams


@dataclass(slots=True)
class Chat:
    params: SamplingParams
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)


class Client:
    def __init__(self, config: EngineConfig | None = None):
        self.lock = threading.Lock()
        self.by_turn: dict[int, list[ev.Event]] = defaultdict(list)
        self.all: list[ev.Event] = []
        self.ended: dict[int, ev.Event] = {}
        self.cond = threading.Condition(self.lock)
        self.chats: dict[int, Chat] = {}
        self._turns: dict[int, tuple[int, str]] = {}  # turn -> (session, kind: submit, regenerate, continue)
        self.engine = Engine(config or EngineConfig(max_session_tokens=512), on_event=self._on_event)

    # -- conversations, as an app keeps them
    def open(self, model_id: int, params: SamplingParams | None = None, system: str | None = None,
             overflow: str = "stop", raw: bool = False) -> int:
        sid = self.engine.open_session(model_id, overflow=overflow, raw=raw)
        with self.lock:
            self.chats[sid] = Chat(params or SamplingParams(), system)
        return sid

    def send(self, sid: int, text: str) -> int:
        with self.lock:
            chat = self.chats[sid]
            chat.messages.append({"role": "user", "content": text})
            turn = self.engine.submit(sid, chat.messages, chat.params, chat.system)
            self._turns[turn] = (sid, "submit")
        return turn

    def regenerate(self, sid: int) -> int:
        with self.lock:
            chat = self.chats[sid]
            if chat.messages and chat.messages[-1]["role"] == "assistant":
                chat.messages.pop()
            turn = self.engine.submit(sid, chat.messages, chat.params, chat.system)
            self._turns[turn] = (sid, "regenerate")
        return turn

    def continue_answer(self, sid: int) -> int:
        with self.lock:
            chat = self.chats[sid]
            turn = self.engine.submit(sid, chat.messages, chat.params, chat.system, continue_final=True)
            self._turns[turn] = (sid, "continue")
        return turn

    def fork(self, sid: int, at_message: int | None = None) -> int:
        child = self.engine.fork(sid)
        with self.lock:
            src = self.chats.get(sid) or Chat(SamplingParams())
            keep = src.messages if at_message is None else src.messages[:at_message]
            self.chats[child] = Chat(src.params, src.system, [dict(m) for m in keep])
        return child

    def rewind(self, sid: int, to_message: int) -> None:
        with self.lock:
            del self.chats[sid].messages[to_message:]

    def close(self, sid: int) -> None:
        self.engine.close(sid)

    def _record_end(self, e: ev.Event) -> None:
        sid, kind = self._turns.pop(e.turn_id, (None, None))
        chat = self.chats.get(sid)
        if chat is None:
            return
        if isinstance(e, ev.Error):
            if kind == "submit" and chat.messages and chat.messages[-1]["role"] == "user":
                chat.messages.pop()  # the failed message is not kept
        elif kind == "continue":
            chat.messages[-1]["content"] = e.text
        elif e.text or e.reason not in ("cancelled", "closed"):
            chat.messages.append({"role": "assistant", "content": e.text})

    # -- events
    def _on_event(self, e: ev.Event) -> None:
        with self.cond:
            self.all.append(e)
            turn = getattr(e, "turn_id", None)
            if turn is not None:
                self.by_turn[turn].append(e)
                if isinstance(e, (ev.Finished, ev.Error)):
                    assert turn not in self.ended, f"turn {turn} ended twice"
                    self.ended[turn] = e
                    self._record_end(e)
            self.cond.notify_all()

    def wait(self, turn_id: int, timeout: float = 120.0) -> ev.Event:
        deadline = time.monotonic() + timeout
        with self.cond:
            while turn_id not in self.ended:
                left = deadline - time.monotonic()
                assert left > 0, f"turn {turn_id} did not end"
                self.cond.wait(left)
            return self.ended[turn_id]

    def wait_for(self, predicate, timeout: float = 120.0) -> ev.Event:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for e in self.all:
                    if predicate(e):
                        return e
                left = deadline - time.monotonic()
                assert left > 0, "event did not arrive"
                self.cond.wait(left)

    def load(self, path) -> int:
        model_id = self.engine.load_model(path)
        got = self.wait_for(lambda e: isinstance(e, (ev.ModelLoaded, ev.ModelFailed)) and e.model_id == model_id)
        assert isinstance(got, ev.ModelLoaded), getattr(got, "message", got)
        return model_id

    def ask(self, sid: int, text: str) -> ev.Finished:
        end = self.wait(self.send(sid, text))
        assert isinstance(end, ev.Finished), getattr(end, "message", end)
        return end

    def tokens(self, turn_id: int) -> list[int]:
        return [t for e in self.by_turn[turn_id] if isinstance(e, ev.TokenDelta) for t in e.token_ids]

    def text(self, turn_id: int) -> str:
        return "".join(e.text for e in self.by_turn[turn_id] if isinstance(e, ev.TokenDelta))

    def free_slots(self, model_id: int) -> int:
        return self.engine.inspect()["models"][model_id]["free_slots"]


@contextmanager
def started_client(config: EngineConfig, model: Path) -> Iterator[Client]:
    """A client whose engine runs with `model` loaded (its id in `client.model`), shut down after."""
    c = Client(config)
    c.engine.start()
    try:
        c.model = c.load(model)
        yield c
    finally:
        c.engine.shutdown()
