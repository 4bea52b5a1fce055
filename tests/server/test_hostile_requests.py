"""Hostile HTTP clients (issue 23): oversized bodies, absurd numbers, forged Host/Origin, clients that leave.

Each answer is a clear 4xx in OpenAI's error shape, and other requests' streams keep going.
"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import pytest

from engine import events as ev
from server.app import ServerSettings
from server.run import BackgroundServer

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}
LIMIT = 64 << 10


@pytest.fixture(scope="module")
def small_server(bridge):
    with BackgroundServer(bridge, settings=ServerSettings(bound_host="127.0.0.1", max_body_bytes=LIMIT)) as s:
        yield s


@contextlib.contextmanager
def slow_steps(bridge, delay: float):
    """Every forward takes `delay` seconds longer: answers last long enough to hang up on or to interleave."""
    model = bridge.engine.loaded_model(bridge.models[0].model_id).model
    real = model.forward

    def slow(*args, **kwargs):
        time.sleep(delay)
        return real(*args, **kwargs)

    model.forward = slow
    try:
        yield
    finally:
        model.forward = real


def post(server, body, path: str = "/chat/completions", **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


def _ok(server) -> None:
    r = post(server, CHAT)
    assert r.status_code == 200, r.text


def _wait_end(bridge, since: int, sid_filter=None, timeout: float = 20.0) -> ev.Event:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in bridge.seen[since:]:
            if isinstance(e, (ev.Finished, ev.Error)) and e.turn_id is not None and (sid_filter is None or sid_filter(e)):
                return e
        time.sleep(0.02)
    raise AssertionError("no turn ended")


# -- item 11: malformed numbers and nesting are 400s, not 500s
MALFORMED = [
    ("nested 2000 deep", b'{"model": "tiny", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}", None, "deeply"),
    ("max_tokens 1e400", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}',
     "max_tokens", "integer"),
    ("max_tokens NaN", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": NaN}',
     "max_tokens", "integer"),
    ("seed NaN", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "seed": NaN}', "seed", "integer"),
    ("temperature Infinity", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": Infinity}',
     "temperature", "number"),
    ("top_k 1e20", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_k": 1e20}', "top_k", "between"),
    ("repeat_last_n -2", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "repeat_last_n": -2}',
     "repeat_last_n", "between"),
    ("repeat_last_n 1.5", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "repeat_last_n": 1.5}',
     "repeat_last_n", "integer"),
    ("seed 2**70", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "seed": 1180591620717411303424}',
     "seed", "64-bit"),
    # a lone surrogate echoed back (or streamed) failed the answer's UTF-8 encoding: a 500, after the turn had run
    ("lone surrogate echoed", b'{"model": "tiny", "prompt": "a\\udc80", "echo": true, "max_tokens": 1}', None,
     "\\udc80, half of a surrogate pair"),
    ("lone surrogate in a key", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], '
                                b'"logit_bias": {"\\uD800": 1}}', None, "\\ud800"),
]


@pytest.mark.parametrize("body, param, words", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_numbers_and_nesting_are_400(server, body, param, words):
    path = "/completions" if b'"prompt"' in body else "/chat/completions"
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    _ok(server)


def test_a_surrogate_pair_in_escapes_is_its_character(server):
    """Python's json.dumps (ensure_ascii) writes an emoji as two \\u escapes: one character, echoed as it was sent."""
    body = b'{"model": "tiny", "prompt": "fox \\ud83e\\udd8a", "echo": true, "max_tokens": 1}'
    r = httpx.post(server.url + "/completions", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("fox \U0001f98a"), r.text


# -- item 3: a hostile top_k must not fail an unrelated stream
def test_huge_top_k_is_refused_and_does_not_touch_another_stream(server, bridge):
    since = len(bridge.seen)
    other = {}

    def stream_other():
        body = CHAT | {"max_tokens": 40, "stream": True, "temperature": 0.8, "top_k": 5, "seed": 1,
                       "stop": ["never \u2603"]}
        with httpx.stream("POST", server.url + "/chat/completions", json=body, timeout=60) as r:
            other["lines"] = [line for line in r.iter_lines() if line]

    with slow_steps(bridge, 0.02):
        t = threading.Thread(target=stream_other)
        t.start()
        time.sleep(0.3)
        for top_k in (10**20, 2**40):
            r = post(server, CHAT | {"temperature": 0.8, "top_k": top_k})
            assert r.status_code == 400 and r.json()["error"]["param"] == "top_k", r.text
        t.join(60)
    assert other["lines"][-1] == "data: [DONE]" and not any('"error"' in line for line in other["lines"])
    assert not [e for e in bridge.seen[since:] if isinstance(e, ev.Error)]


# -- item 2: a body over the limit is refused before it is read or tokenised
def test_body_over_the_limit_is_413_and_never_reaches_the_engine(small_server, bridge):
    since = len(bridge.seen)
    huge = CHAT | {"messages": [{"role": "user", "content": "word " * (LIMIT // 4)}]}
    r = post(small_server, huge)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert not [e for e in bridge.seen[since:] if isinstance(e, (ev.Started, ev.Error))]
    _ok(small_server)


def test_chunked_body_over_the_limit_is_413(small_server):
    def chunks():
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(LIMIT // 1024 + 2):
            yield b"x" * 1024
        yield b'"}]}'

    r = httpx.post(small_server.url + "/chat/completions", content=chunks(),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413, r.text


def test_default_body_limit_is_a_setting_with_a_sensible_default():
    assert 1 << 20 <= ServerSettings().max_body_bytes <= 64 << 20
    with pytest.raises(ValueError, match="max_body_bytes"):
        ServerSettings(max_body_bytes=0)


# -- item 12: DNS rebinding and cross-site simple POSTs
@pytest.mark.parametrize("headers, status", [
    ({"host": "attacker.example:8000"}, 421),
    ({"host": "attacker.example"}, 421),
    ({"origin": "http://attacker.example"}, 403),
    ({"origin": "null"}, 403),
], ids=["rebound host", "rebound host no port", "foreign origin", "sandboxed origin"])
def test_foreign_host_and_origin_are_refused(server, bridge, headers, status):
    since = len(bridge.seen)
    r = post(server, CHAT, headers=headers)
    assert r.status_code == status, r.text
    assert not [e for e in bridge.seen[since:] if isinstance(e, ev.Started)]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "LOCALHOST"])
def test_loopback_names_are_accepted(server, host):
    r = post(server, CHAT, headers={"host": f"{host}:{server.port}", "origin": f"http://{host}:{server.port}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_cross_site_simple_content_types_are_refused(server, bridge, content_type):
    since = len(bridge.seen)
    headers = {"content-type": content_type} if content_type else {}
    r = httpx.post(server.url + "/chat/completions", content=json.dumps(CHAT).encode(), headers=headers, timeout=30)
    assert r.status_code == 415, r.text
    assert not [e for e in bridge.seen[since:] if isinstance(e, ev.Started)]


def test_wildcard_bind_accepts_any_name_and_named_bind_only_its_own():
    from server.app import _allowed_host

    assert _allowed_host("my-box.lan", ServerSettings(bound_host="0.0.0.0"))
    named = ServerSettings(bound_host="192.168.1.5", allowed_hosts=("proxy.lan",))
    assert _allowed_host("192.168.1.5", named) and _allowed_host("proxy.lan", named)
    assert not _allowed_host("localhost", named) and not _allowed_host("evil.example", named)
    assert _allowed_host("::1", ServerSettings(bound_host="::1"))


# -- item 17: a non-ASCII API key works for clients that send it as UTF-8
def test_non_ascii_api_key_accepts_utf8_clients(bridge):
    key = "clé-ключ-🔑"
    with BackgroundServer(bridge, api_key=key) as s:
        good = httpx.get(s.url + "/models", headers={"authorization": b"Bearer " + key.encode()}, timeout=10)
        bad = httpx.get(s.url + "/models", headers={"authorization": b"Bearer " + "cle".encode()}, timeout=10)
    assert good.status_code == 200, good.text
    assert bad.status_code == 401


# -- item 4: a non-streaming client that hangs up cancels its answer
def _post_and_hang_up(server, body: dict, after: float) -> None:
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        time.sleep(after)


def test_non_streaming_client_that_leaves_cancels_its_turn(server, bridge):
    since = len(bridge.seen)
    body = CHAT | {"max_tokens": 200, "stop": ["never \u2603"], "messages": [{"role": "user", "content": "go"}]}
    with slow_steps(bridge, 0.05):  # 200 tokens: 10 s if nobody cancels
        start = time.monotonic()
        _post_and_hang_up(server, body, after=0.8)
        end = _wait_end(bridge, since, timeout=30)
        took = time.monotonic() - start
    assert isinstance(end, ev.Finished) and end.reason in ("cancelled", "closed"), end
    assert end.stats.completion_tokens < 100 and took < 5, (end.stats.completion_tokens, took)
    assert bridge.open_sessions() == 0


def test_a_streaming_client_that_leaves_mid_answer_frees_its_sessions_and_slots_at_once(server, bridge):
    """Measured 0.04-0.08 s from the hang-up to every session closed and every cache slot free (n=1 and n=4)."""
    payload = json.dumps(CHAT | {"max_tokens": 200, "n": 2, "stream": True, "stop": ["never \u2603"]}).encode()
    with slow_steps(bridge, 0.03), socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        got = b""
        while got.count(b'"content": "') < 6:  # both choices answering
            got += sock.recv(65536)
        assert bridge.engine.inspect()["sessions"] == 2
        sock.close()
        start = time.monotonic()
        left = bridge.open_sessions()
        took = time.monotonic() - start
    slots = next(iter(bridge.engine.inspect()["models"].values()))["free_slots"]
    assert left == 0 and took < 3 and slots == 8, (left, took, slots)


# -- the load check, scaled to a CPU test: streams keep their pace while a 100 MB request and 50 clients
# that hang up arrive
def _stream_gaps(server, n_tokens: int, out: list) -> None:
    body = CHAT | {"max_tokens": n_tokens, "stream": True, "stop": ["never \u2603"]}
    stamps = []
    with httpx.stream("POST", server.url + "/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                stamps.append(time.monotonic())
    out.append([b - a for a, b in zip(stamps[2:], stamps[3:])])  # after the prefill


def _p99(gaps: list[float]) -> float:
    gaps = sorted(gaps)
    return gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _huge_request(server) -> int:
    head, tail, chunk = b'{"model": "tiny", "messages": [{"role": "user", "content": "', b'"}]}', b"x" * (1 << 20)

    def body():
        yield head
        for _ in range(100):
            yield chunk
        yield tail

    size = len(head) + 100 * len(chunk) + len(tail)
    try:
        r = httpx.post(server.url + "/chat/completions", content=body(), timeout=60,
                       headers={"content-type": "application/json", "content-length": str(size)})
        return r.status_code
    except httpx.HTTPError:
        return 413  # refused before the upload ended: the server hung up on it


def _phase(server, streams: int, tokens: int, attack: bool) -> tuple[list[float], int | None]:
    out: list = []
    threads = [threading.Thread(target=_stream_gaps, args=(server, tokens, out)) for _ in range(streams)]
    for t in threads:
        t.start()
    status = None
    if attack:
        time.sleep(0.5)
        leavers = [threading.Thread(target=_post_and_hang_up, args=(server, CHAT | {"max_tokens": 40}, 0.1))
                   for _ in range(50)]
        for t in leavers:
            t.start()
        status = _huge_request(server)
        for t in leavers:
            t.join(60)
    for t in threads:
        t.join(120)
    return [g for gaps in out for g in gaps], status


def test_streams_keep_pace_while_a_huge_request_and_leaving_clients_arrive(server, bridge):
    with slow_steps(bridge, 0.03):  # a step takes about as long as a small GPU model's
        for _ in range(3):  # a stall the attack causes repeats; a one-off pause of a busy 2-core CI machine does not
            normal, _ = _phase(server, 4, 60, attack=False)
            rss_before = _rss()
            attacked, status = _phase(server, 4, 60, attack=True)
            grew = _rss() - rss_before
            if _p99(attacked) < 2 * _p99(normal):
                break
    print(f"p99 gap normal {_p99(normal) * 1000:.0f} ms, under attack {_p99(attacked) * 1000:.0f} ms, "
          f"RSS +{grew >> 20} MB")
    assert status == 413
    assert _p99(attacked) < 2 * _p99(normal), (_p99(normal), _p99(attacked))
    assert grew < 200 << 20, f"RSS grew {grew >> 20} MB"
    deadline = time.monotonic() + 10
    while bridge.open_sessions() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bridge.open_sessions() == 0


def test_web_pages_of_a_cors_origin_may_call_the_api_and_no_others(bridge):
    """--cors-origin: a browser's preflight is answered and the answer readable by that page; other origins and
    servers without the option still refuse."""
    page = "http://localhost:3000"
    with BackgroundServer(bridge, settings=ServerSettings(cors_origins=(page,))) as s:
        pre = httpx.options(s.url + "/chat/completions", timeout=10, headers={
            "origin": page, "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == page
        r = httpx.post(s.url + "/chat/completions", json=CHAT, headers={"origin": page}, timeout=30)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == page
        other = httpx.post(s.url + "/chat/completions", json=CHAT, headers={"origin": "http://evil.example"}, timeout=30)
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    with pytest.raises(ValueError, match="CORS origin"):
        ServerSettings(cors_origins=("localhost:3000/app",))


def test_hosts_and_origins_given_in_capitals_or_with_a_port_match_what_clients_send(bridge):
    """--allow-host Proxy.LAN:8080 and --cors-origin http://LocalHost:3000/ were compared as typed with the request's
    Host (lower case, without its port) and a browser's Origin (lower case): every request through them was refused
    (421, and 403 for the page); --allow-host '' let a request without a Host header in."""
    settings = ServerSettings(allowed_hosts=("Proxy.LAN:8080",), cors_origins=("http://LocalHost:3000/",))
    with BackgroundServer(bridge, settings=settings) as s:
        via_proxy = httpx.get(s.url + "/models", headers={"host": "proxy.lan:8080"}, timeout=10)
        assert via_proxy.status_code == 200, via_proxy.text
        page = "http://localhost:3000"
        pre = httpx.options(s.url + "/chat/completions", timeout=10, headers={
            "origin": page, "access-control-request-method": "POST", "access-control-request-headers": "content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == page
        r = httpx.post(s.url + "/chat/completions", json=CHAT, headers={"origin": page}, timeout=30)
        assert r.status_code == 200, r.text
        assert httpx.get(s.url + "/models", headers={"host": "evil.example"}, timeout=10).status_code == 421
    with pytest.raises(ValueError, match="an allowed host is a name"):
        ServerSettings(allowed_hosts=(" ",))


def test_an_empty_api_key_asks_for_none():
    from cli.serve import api_key

    assert api_key("") is None and api_key("  ") is None and api_key(None) is None and api_key("k") == "k"


def test_two_models_of_one_name_get_ids_apart(tiny_models):
    from engine.runtime import EngineConfig
    from server.bridge import ServerBridge

    b = ServerBridge(EngineConfig(max_sessions=1, max_session_tokens=64)).start()
    try:
        first = b.load(tiny_models["llama"].gguf_path)
        second = b.load(tiny_models["llama"].gguf_path)
        assert first.id != second.id and b.find(second.id) is second and b.find(first.id) is first
    finally:
        b.shutdown()
