"""The remote backend against a server no one here wrote: llama-cpp-python's OpenAI-compatible server on the
embedded Gemma GGUF, started by the test on loopback (the Makefile builds llama.cpp without AMX)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from engine import events as ev
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from server.run import free_port
from tests.support.engine_client import Client

pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed (make setup-test builds it)")
pytestmark = pytest.mark.slow

KEY = "sk-llama-cpp-test"
ALIAS = "gemma-llamacpp"


@pytest.fixture(scope="module")
def llama_server(gemma_gguf_path, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("llama") / "server.log", "w+")
    # one thread: ggml's worker threads spin-wait, which crawls (~0.5 tok/s) on two busy shared cores
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gemma_gguf_path), "--model_alias", ALIAS,
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024", "--n_threads", "1", "--n_threads_batch", "1",
           "--chat_format", "gemma", "--api_key", KEY, "--verbose", "False"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"llama_cpp.server did not start:\n{log.read()[-3000:]}")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture
def client():
    c = Client(EngineConfig(max_sessions=2, max_session_tokens=256))
    c.engine.start()
    yield c
    c.engine.shutdown()


def add(c: Client, url: str, model: str | None, key: str | None) -> ev.Event:
    mid = c.engine.add_remote_model(url, model, key, timeout=60)
    return c.wait_for(lambda e: isinstance(e, (ev.ModelLoaded, ev.ModelFailed)) and e.model_id == mid, timeout=60)


def direct(url: str, body: dict) -> dict:
    """llama.cpp's own answer, non-streaming, without Parley in the way."""
    r = httpx.post(url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_streams_the_same_answer_llama_cpp_gives_directly(client, llama_server):
    loaded = add(client, llama_server, ALIAS, KEY)
    assert isinstance(loaded, ev.ModelLoaded), loaded
    assert loaded.info["remote"] is True and loaded.name == ALIAS
    sid = client.open(loaded.model_id, params=SamplingParams(max_tokens=12), system="Answer in one sentence.")
    history = [{"role": "system", "content": "Answer in one sentence."}]
    for question in ["What is the capital of France?", "And of Italy?"]:  # the second replays the first turn
        end = client.ask(sid, question)
        deltas = [e for e in client.by_turn[end.turn_id] if isinstance(e, ev.TokenDelta)]
        assert len(deltas) > 1 and "".join(e.text for e in deltas) == end.text and end.text.strip()
        history.append({"role": "user", "content": question})
        want = direct(llama_server, {"model": ALIAS, "temperature": 0, "max_tokens": 12, "messages": history})
        assert end.text == want["choices"][0]["message"]["content"]
        assert end.reason == want["choices"][0]["finish_reason"]
        history.append({"role": "assistant", "content": end.text})
        s = end.stats
        assert s.ttft_s > 0 and s.tokens_per_s > 0
        # llama.cpp streams no usage: Parley counts its chunks, one per token
        assert abs(s.completion_tokens - want["usage"]["completion_tokens"]) <= 1


def test_sampling_settings_reach_llama_cpp(client, llama_server):
    loaded = add(client, llama_server, ALIAS, KEY)
    seeded = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, min_p=0.05, seed=1234, max_tokens=8)
    texts = [client.ask(client.open(loaded.model_id, params=seeded), "Write a story.").text
             for _ in range(2)]
    assert texts[0] == texts[1] and texts[0].strip()  # same seed, same draw
    greedy = client.ask(client.open(loaded.model_id, params=SamplingParams(max_tokens=16)),
                        "Count from one to ten.")
    cut = greedy.text[len(greedy.text) // 2:][:4]
    stopped = client.ask(client.open(loaded.model_id, params=SamplingParams(max_tokens=16, stop=[cut])),
                         "Count from one to ten.")
    assert stopped.text == greedy.text[: greedy.text.index(cut)] and stopped.reason == "stop"


def test_cancel_mid_stream_then_the_next_turn_works(client, llama_server):
    loaded = add(client, llama_server, ALIAS, KEY)
    sid = client.open(loaded.model_id, params=SamplingParams(temperature=0.8, seed=1, max_tokens=400))
    turn = client.send(sid, "Write a very long essay about the sea.")
    client.wait_for(lambda e: isinstance(e, ev.TokenDelta) and e.turn_id == turn, timeout=60)
    t0 = time.monotonic()
    client.engine.cancel(sid)
    end = client.wait(turn, timeout=5)
    assert isinstance(end, ev.Finished) and end.reason == "cancelled" and time.monotonic() - t0 < 1
    assert end.stats.completion_tokens < 400
    client.chats[sid].params = SamplingParams(max_tokens=4)  # for the turns after this one
    t1 = time.monotonic()
    nxt = client.ask(sid, "Now one word.")  # llama.cpp serves one request at a time: it must have stopped
    assert nxt.stats.completion_tokens <= 4 and time.monotonic() - t1 < 15


def test_wrong_key_missing_key_and_unknown_model(client, llama_server):
    for key in ("wrong", None):
        failed = add(client, llama_server, ALIAS, key)
        assert isinstance(failed, ev.ModelFailed) and "refused the request (401)" in failed.message, failed
    failed = add(client, llama_server, "llama-9000", KEY)
    assert isinstance(failed, ev.ModelFailed) and f"it serves {ALIAS}" in failed.message
