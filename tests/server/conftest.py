"""A Parley server on a tiny model, in-process on a free loopback port, shared by the server tests."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from engine import events as ev
from engine.runtime import EngineConfig
from server.bridge import ServerBridge
from server.run import BackgroundServer

API_KEY = "sk-test-parley"


class RecordingBridge(ServerBridge):
    """Keeps every engine event so tests can see how each session's turn ended."""

    def __init__(self, config: EngineConfig):
        self.seen: list[ev.Event] = []
        super().__init__(config)

    def _on_event(self, e: ev.Event) -> None:
        self.seen.append(e)
        super()._on_event(e)

    def open_sessions(self, settle: float = 5.0) -> int:
        """Sessions still open once the server had `settle` seconds to close them: a client may read [DONE] before
        the server's stream closes its session (and the engine thread takes the Close)."""
        deadline = time.monotonic() + settle
        while (n := self.engine.inspect()["sessions"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        return n


@contextmanager
def tiny_bridge(tiny_models, max_sessions: int, kind: type[RecordingBridge] = RecordingBridge) -> Iterator[RecordingBridge]:
    """The tiny Qwen3 served as "tiny" with `max_sessions` sessions, on a bridge of `kind`."""
    b = kind(EngineConfig(max_sessions=max_sessions, max_session_tokens=256, step_tokens=64,
                                     chunk_tokens=32)).start()
    b.load(tiny_models["qwen3"].gguf_path, alias="tiny")
    try:
        yield b
    finally:
        b.shutdown()


@pytest.fixture(scope="module")
def bridge(tiny_models):
    with tiny_bridge(tiny_models, 8) as b:
        yield b


@pytest.fixture(scope="module")
def server(bridge):
    with BackgroundServer(bridge) as s:
        yield s


@pytest.fixture(scope="module")
def keyed_server(bridge):
    with BackgroundServer(bridge, api_key=API_KEY) as s:
        yield s


@pytest.fixture(scope="module")
def bos_server(tiny_models):
    """The tiny Llama, whose text prompts start with <|begin_of_text|>, served as "tiny"; and its tokenizer."""
    bridge = ServerBridge(EngineConfig(max_sessions=4, max_session_tokens=256)).start()
    bridge.load(tiny_models["llama"].gguf_path, alias="tiny")
    try:
        with BackgroundServer(bridge) as server:
            yield server, bridge.models[0].tokenizer
    finally:
        bridge.shutdown()
