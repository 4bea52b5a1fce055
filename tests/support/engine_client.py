"""A test client for the engine thread: collects events and waits for turns to end."""
from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict

from engine import events as ev
from engine.engine import Engine
from engine.runtime import EngineConfig


class Client:
    def __init__(self, config: EngineConfig | None = None):
        self.lock = threading.Lock()
        self.by_turn: dict[int, list[ev.Event]] = defaultdict(list)
        self.all: list[ev.Event] = []
        self.ended: dict[int, ev.Event] = {}
        self.cond = threading.Condition(self.lock)
        self.engine = Engine(config or EngineConfig(max_session_tokens=512), on_event=self._on_event)

    def _on_event(self, e: ev.Event) -> None:
        with self.cond:
            self.all.append(e)
            turn = getattr(e, "turn_id", None)
            if turn is not None:
                self.by_turn[turn].append(e)
                if isinstance(e, (ev.Finished, ev.Error)):
                    assert turn not in self.ended, f"turn {turn} ended twice"
                    self.ended[turn] = e
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
        end = self.wait(self.engine.submit(sid, text))
        assert isinstance(end, ev.Finished), getattr(end, "message", end)
        return end

    def tokens(self, turn_id: int) -> list[int]:
        return [t for e in self.by_turn[turn_id] if isinstance(e, ev.TokenDelta) for t in e.token_ids]

    def text(self, turn_id: int) -> str:
        return "".join(e.text for e in self.by_turn[turn_id] if isinstance(e, ev.TokenDelta))

    def free_slots(self, model_id: int) -> int:
        return self.engine.call(lambda eng: eng._models[model_id].cache.book.free_slots)
