"""/health says how busy the server is (a load balancer picks the least busy), without asking the engine thread."""
from __future__ import annotations

import threading
import time

import httpx

from server.run import BackgroundServer
from tests.server.conftest import tiny_bridge
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
            while time.monotonic() < deadline and seen.get("queued") != 1:
                seen = _health(server.url)[1]
            assert seen | {"status": "ok"} == {"status": "ok", "requests": 1, "decoding": 1, "queued": 1, "models": 1}
            client.join(60)
        assert [status for status, _ in out] == [200]
