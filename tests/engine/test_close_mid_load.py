"""Closing the engine while a model loads: the load stops at its next checkpoint, so no thread is left inside torch
when the process exits (that aborted the app closed mid-load: 'terminate called without an active exception')."""
from __future__ import annotations

import threading
import time

from engine import events as ev
from engine.engine import Engine
from engine.runtime import EngineConfig


def test_a_load_stops_at_its_next_tensor_once_the_engine_closes(tiny_models):
    events: list[ev.Event] = []
    loading = threading.Event()
    engine: Engine | None = None

    def sink(e: ev.Event) -> None:
        events.append(e)
        if isinstance(e, ev.ModelProgress) and e.stage == "Decoding weights" and not loading.is_set():
            loading.set()  # hold the load at its first tensor until the engine is closing
            deadline = time.monotonic() + 10
            while not engine._stopping and time.monotonic() < deadline:
                time.sleep(0.005)

    engine = Engine(EngineConfig(max_sessions=1, max_session_tokens=64), on_event=sink).start()
    engine.load_model(tiny_models["llama"].gguf_path)
    assert loading.wait(30)
    engine.shutdown()
    loader = [t for t in threading.enumerate() if t.name.startswith("parley-load")]
    assert not loader  # ended with the engine, not left running into the interpreter's exit
    decoding = [e for e in events if isinstance(e, ev.ModelProgress) and e.stage == "Decoding weights"]
    assert len(decoding) == 1  # not one tensor more read after the close
    assert not any(isinstance(e, ev.ModelLoaded) for e in events)
