"""The server under load: more requests than sessions, clients that leave while they wait, stopping with
answers in flight."""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import httpx
import pytest

from engine import events as ev
from server.run import BackgroundServer
from tests.server.conftest import tiny_bridge
from tests.server.test_hostile_requests import _post_and_hang_up, slow_steps

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "temperature": 0, "stop": ["never \u2603"]}


@pytest.fixture(scope="module")
def two_slots(tiny_models):
    """A model with two sessions: a third request waits in the queue."""
    with tiny_bridge(tiny_models, 2) as b:
        yield b


def _ended(bridge, since: int) -> list[ev.Event]:
    return [e for e in bridge.seen[since:] if isinstance(e, (ev.Finished, ev.Error)) and e.turn_id is not None]


def _stream(url: str, body: dict, out: list) -> None:
    """Appends (status, chunks) where chunks are the stream's data payloads, or (error, []) if it broke off."""
    try:
        with httpx.stream("POST", url + "/chat/completions", json=body | {"stream": True}, timeout=60) as r:
            out.append((r.status_code, [line[6:] for line in r.iter_lines() if line.startswith("data: ")]))
    except httpx.HTTPError as exc:
        out.append((repr(exc), []))


def _post(url: str, body: dict, out: list) -> None:
    try:
        r = httpx.post(url + "/chat/completions", json=body, timeout=60)
        out.append((r.status_code, r.json()))
    except (httpx.HTTPError, ValueError) as exc:
        out.append((repr(exc), {}))


def test_clients_that_leave_while_queued_never_start(two_slots):
    bridge = two_slots
    since = len(bridge.seen)
    out: list = []
    with BackgroundServer(bridge) as server, slow_steps(bridge, 0.05):
        holders = [threading.Thread(target=_stream, args=(server.url, CHAT | {"max_tokens": 40}, out)) for _ in range(2)]
        for t in holders:
            t.start()
        time.sleep(0.5)
        leavers = [threading.Thread(target=_post_and_hang_up, args=(server, CHAT | {"max_tokens": 40, "stream": s}, 0.8))
                   for s in (True, False, True)]
        for t in leavers:
            t.start()
        for t in leavers + holders:
            t.join(60)
    ended = _ended(bridge, since)
    assert sorted(e.reason for e in ended) == ["cancelled"] * 3 + ["length"] * 2, ended
    assert all(e.stats.completion_tokens == 0 for e in ended if e.reason == "cancelled")
    assert [status for status, _ in out] == [200, 200]
    assert bridge.open_sessions() == 0


def test_stopping_the_server_ends_answers_in_flight_with_a_clear_error(two_slots):
    """Ctrl+C with streams running and requests queued: each client gets a 503 or an error event and [DONE] at once,
    not a connection cut after the 5 s grace (and a traceback per request in the server's log)."""
    bridge = two_slots
    out_streams: list = []
    out_posts: list = []
    server = BackgroundServer(bridge).__enter__()
    with slow_steps(bridge, 0.1):  # 200 tokens (or the tiny model's end after ~60): 6 s or more unless stopped
        body = CHAT | {"max_tokens": 200}
        clients = [threading.Thread(target=_stream, args=(server.url, body, out_streams)) for _ in range(3)]
        clients.append(threading.Thread(target=_post, args=(server.url, body, out_posts)))
        for t in clients:
            t.start()
            time.sleep(0.2)
        time.sleep(0.8)
        start = time.monotonic()
        server.__exit__(None, None, None)
        took = time.monotonic() - start
        for t in clients:
            t.join(30)
    assert took < 3, f"the server took {took:.1f} s to stop"
    assert [status for status, _ in out_streams] == [200] * 3 and [s for s, _ in out_posts] == [503], (out_streams,
                                                                                                      out_posts)
    for _, chunks in out_streams:  # a queued stream too: its headers went out when its turn was accepted
        assert chunks[-1] == "[DONE]"
        assert json.loads(chunks[-2])["error"]["code"] == "server_shutting_down"
    assert out_posts[0][1]["error"]["code"] == "server_shutting_down"
    assert bridge.open_sessions() == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc")
def test_three_hundred_clients_at_once_under_a_low_open_files_limit(two_slots):
    """A desktop's soft limit (1024, macOS 256) is less than a server's clients need: serving lifts it to the hard one,
    else a few hundred at once failed the engine's generations with 'Too many open files' (a 500 for each)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit on open files ({hard}) leaves nothing to lift")
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 150, hard))
    try:
        with BackgroundServer(two_slots) as server:
            statuses = asyncio.run(_many_at_once(server.url, 300))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert statuses == [200] * 300, sorted(set(map(str, statuses)))


async def _many_at_once(url: str, n: int) -> list:
    async def one(client: httpx.AsyncClient, i: int):
        try:
            r = await client.post(url + "/chat/completions", json=CHAT | {"max_tokens": 2}, timeout=120)
            return r.status_code if r.status_code == 200 else r.text[:120]
        except httpx.HTTPError as exc:
            return repr(exc)[:120]

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n)) as client:
        return await asyncio.gather(*(one(client, i) for i in range(n)))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="takes every descriptor, counted in /proc")
def test_a_fresh_servers_first_turns_need_no_file_descriptor(tiny_models):
    """300 clients at once on a server that had answered nothing yet took every file descriptor before its first
    step, whose one-time imports then failed 124 of them ("Generation failed: OSError(24, 'Too many open files')").
    The load now runs the step once: later turns, greedy and sampled, open no file."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.descriptors import TAKE_EVERY_DESCRIPTOR

    script = f"""
import os, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from engine import events as ev
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.server.conftest import RecordingBridge

b = RecordingBridge(EngineConfig(max_sessions=2, max_session_tokens=256)).start()
model = b.load({str(tiny_models["qwen3"].gguf_path)!r})
{TAKE_EVERY_DESCRIPTOR}
for params in (SamplingParams(max_tokens=4), SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.2, max_tokens=4)):
    sid = b.engine.open_session(model.model_id)
    b.engine.submit(sid, [{{"role": "user", "content": "hello"}}], params)
deadline = time.monotonic() + 60
while sum(isinstance(e, (ev.Finished, ev.Error)) for e in b.seen) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
print([type(e).__name__ + (": " + e.message if isinstance(e, ev.Error) else "") for e in b.seen
       if isinstance(e, (ev.Finished, ev.Error))])
os._exit(0)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert run.stdout.strip() == "['Finished', 'Finished']", (run.stdout + run.stderr)[-800:]


def test_a_request_of_many_answers_takes_the_slots_in_turn_with_others(two_slots):
    """n=128 submitted whole took every slot until its last answer began: a request after it waited 65 s for 4 tokens
    (8 slots, 255 tokens an answer; now 2.3-2.9 s). Its answers now take the slots in turn: on two slots, a request
    sent while n=6 answers runs gets its first token once one of them has ended, not four."""
    out, ended_before = _chat_during(two_slots, lambda url, out: _post(url, CHAT | {"max_tokens": 12, "n": 6}, out))
    assert [status for status, _ in out] == [200, 200], out
    assert sorted(len(body["choices"]) for _, body in out) == [1, 6]
    assert ended_before <= 2, f"{ended_before} of the six answers ended before the other request's first token"
    assert two_slots.open_sessions() == 0


def _chat_during(bridge, many) -> tuple[list, int]:
    """Runs `many(url, out)` (a request of six 12-token answers) on slowed steps, and once its first token is out a
    one-token chat: (status, body) of both in `out`, and how many answers had ended before the chat's first token."""
    since = len(bridge.seen)
    out: list = []
    with BackgroundServer(bridge) as server, slow_steps(bridge, 0.02):
        first = threading.Thread(target=many, args=(server.url, out))
        first.start()
        deadline = time.monotonic() + 30
        while not any(isinstance(e, ev.TokenDelta) for e in bridge.seen[since:]) and time.monotonic() < deadline:
            time.sleep(0.01)
        _post(server.url, CHAT | {"max_tokens": 1}, out)
        first.join(60)
    events = bridge.seen[since:]
    alone = {e.session_id for e in events if isinstance(e, ev.Finished) and e.stats.completion_tokens == 1}
    first_token = next(k for k, e in enumerate(events) if isinstance(e, ev.TokenDelta) and e.session_id in alone)
    return out, sum(isinstance(e, ev.Finished) for e in events[:first_token])


def test_a_completion_of_many_prompts_takes_the_slots_in_turn_with_others(two_slots):
    """Each prompt's first answer goes to the engine at once (a prompt it refuses is the request's 400), so a
    completion of 256 prompts took the slots until its last answer began: a chat sent after it waited 23 s. Its
    answers are now one group, which the engine's queue takes in turn with other requests' turns (engine/scheduler.py):
    on two slots, a chat sent while six prompts' answers run gets its first token once one or two of them have ended."""
    def complete(url: str, out: list) -> None:
        r = httpx.post(url + "/completions", json={"model": "tiny", "prompt": [f"count {i}" for i in range(6)],
                                                  "max_tokens": 12, "temperature": 0}, timeout=60)
        out.append((r.status_code, r.json()))

    out, ended_before = _chat_during(two_slots, complete)
    assert sorted(status for status, _ in out) == [200, 200], out
    assert sorted(len(body["choices"]) for _, body in out) == [1, 6]
    assert ended_before <= 2, f"{ended_before} of the six answers ended before the other request's first token"
    assert two_slots.open_sessions() == 0
