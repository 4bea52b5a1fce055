"""/health says how busy the server is (a load balancer picks the least busy), without asking the engine thread."""
from __future__ import annotations

import threading
import time

import httpx

from engine import events as ev

from server.run import BackgroundServer
from tests.server.conftest import RecordingBridge, tiny_bridge
from tests.server.test_hostile_requests import slow_steps
from tests.server.test_load_sweep import CHAT, _stream


def _health(url: str) -> tuple[float, dict]:
    start = time.monotonic()
    r = httpx.get(url.removesuffix("/v1") + "/health", timeout=10)
    assert r.status_code == 200
    return time.monotonic() - start, r.json()


def test_health_counts_requests_decoding_and_queued_while_the_engine_is_busy(tiny_models):
    """Before: {"status": "ok"} whatever the load."""
    with tiny_bridge(tiny_models, 1) as bridge, BackgroundServer(bridge) as server:
        assert _health(server.url)[1] == {"status": "ok", "requests": 0, "decoding": 0, "queued": 0, "models": 1}
        out: list = []
        with slow_steps(bridge, 0.3):  # each step holds the engine thread 0.3 s
            clients = [threading.Thread(target=_stream, args=(server.url, CHAT | {"max_tokens": 6}, out))
                       for _ in range(2)]
            for t in clients:
                t.start()
            deadline, seen, slowest = time.monotonic() + 20, {}, 0.0
            while time.monotonic() < deadline and seen.get("queued") != 1:
                took, seen = _health(server.url)
                slowest = max(slowest, took)
            assert seen | {"status": "ok"} == {"status": "ok", "requests": 2, "decoding": 1, "queued": 1, "models": 1}
            assert slowest < 0.25  # answered between steps' sleeps, not behind them
            for t in clients:
                t.join(60)
        assert [status for status, _ in out] == [200, 200]
        deadline = time.monotonic() + 5
        while _health(server.url)[1]["requests"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _health(server.url)[1] == {"status": "ok", "requests": 0, "decoding": 0, "queued": 0, "models": 1}


def test_health_counts_a_request_of_several_choices_once(tiny_models):
    """Before: a request of n = 2 counted as 2 requests."""
    with tiny_bridge(tiny_models, 1) as bridge, BackgroundServer(bridge) as server:
        out: list = []
        with slow_steps(bridge, 0.3):
            client = threading.Thread(target=_stream, args=(server.url, CHAT | {"max_tokens": 6, "n": 2}, out))
            client.start()
            deadline, seen = time.monotonic() + 20, {}
            # the server holds the second choice back at once (server/choices.py): wait for the first to decode too
            while time.monotonic() < deadline and (seen.get("queued"), seen.get("decoding")) != (1, 1):
                seen = _health(server.url)[1]
            assert seen | {"status": "ok"} == {"status": "ok", "requests": 1, "decoding": 1, "queued": 1, "models": 1}
            client.join(60)
        assert [status for status, _ in out] == [200]


class _BusyAfterEachEvent(RecordingBridge):
    """Notes (session, what /health says, the session's phase) after every event the bridge routes."""

    def __init__(self, config):
        self.busy_seen: list[tuple[int, dict, str | None]] = []
        super().__init__(config)

    def _on_event(self, e) -> None:
        super()._on_event(e)
        if getattr(e, "session_id", None) is not None:
            self.busy_seen.append((e.session_id, self.busy(), self._phase.get(e.session_id)))


def test_health_never_counts_a_request_decoding_that_the_queue_holds(tiny_models):
    """A burst on a model of one session: each request was counted decoding at its Started (sent before the engine's
    step found no slot for it), then queued a step later: {"decoding": 2, "queued": 0} on one slot, then
    {"decoding": 1, "queued": 1}. A request waiting for the slot is counted queued from the first."""
    with tiny_bridge(tiny_models, 1, _BusyAfterEachEvent) as bridge, BackgroundServer(bridge) as server:
        out: list = []
        with slow_steps(bridge, 0.1):
            first = threading.Thread(target=_stream, args=(server.url, CHAT | {"max_tokens": 20}, out))
            first.start()
            deadline = time.monotonic() + 20  # the burst comes while the first request holds the slot
            while not any(isinstance(e, ev.TokenDelta) for e in bridge.seen) and time.monotonic() < deadline:
                time.sleep(0.01)
            burst = [threading.Thread(target=_stream, args=(server.url, CHAT | {"max_tokens": 2}, out))
                     for _ in range(2)]
            for t in burst:
                t.start()
            for t in [first, *burst]:
                t.join(60)
        assert [status for status, _ in out] == [200, 200, 200]
        assert max(busy["decoding"] for _, busy, _ in bridge.busy_seen) == 1
        assert max(busy["queued"] for _, busy, _ in bridge.busy_seen) == 2
        for sid in {sid for sid, _, _ in bridge.busy_seen}:  # queued, then decoding: never back to the queue
            phases = [phase for other, _, phase in bridge.busy_seen if other == sid and phase]
            assert phases == sorted(phases, key=["queued", "decoding"].index), phases
