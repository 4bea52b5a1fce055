"""Remote models through the Engine API: the same commands and events as local ones, over HTTP.

The endpoint here is Parley's own server on a tiny model (fast, always available), so a remote session
can be checked turn by turn against a local session on the same model; test_remote_llama_cpp.py runs
the backend against llama.cpp's server, which no one here wrote.
"""
from __future__ import annotations

import time

import pytest

from engine import events as ev
from engine.errors import ParleyError
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from server.run import free_port
from tests.server.conftest import API_KEY
from tests.server.stall_server import MODEL, StallServer
from tests.support.engine_client import Client

GREEDY = SamplingParams(max_tokens=10)


@pytest.fixture
def remote_client():
    c = Client(EngineConfig(max_sessions=2, max_session_tokens=256))
    c.engine.start()
    yield c
    c.engine.shutdown()


def add_remote(c: Client, url: str, model: str | None, key: str | None = None, timeout: float = 30) -> ev.Event:
    mid = c.engine.add_remote_model(url, model, key, timeout)
    return c.wait_for(lambda e: isinstance(e, (ev.ModelLoaded, ev.ModelFailed)) and e.model_id == mid, timeout=60)


def test_remote_session_equals_local_session_turn_by_turn(remote_client, bridge, server):
    served = bridge.models[0].id  # what /v1/models lists
    loaded = add_remote(remote_client, server.url, served)
    assert isinstance(loaded, ev.ModelLoaded), loaded
    assert loaded.info["remote"] is True and loaded.name == served and loaded.info["context"] == 256
    local = Client(EngineConfig(max_sessions=2, max_session_tokens=256))
    local.engine.start()
    try:
        local_model = local.load(bridge.models[0].info["source"])
        lsid = local.open(local_model, params=GREEDY, system="Be brief.")
        rsid = remote_client.open(loaded.model_id, params=GREEDY, system="Be brief.")
        for text in ["Hello there", "Tell me more", "And finally?"]:
            want = local.ask(lsid, text)
            got = remote_client.ask(rsid, text)
            assert got.text == want.text and got.reason == want.reason
            events = remote_client.by_turn[got.turn_id]
            assert isinstance(events[0], ev.Started) and isinstance(events[-1], ev.Finished)
            deltas = [e for e in events if isinstance(e, ev.TokenDelta)]
            assert "".join(e.text for e in deltas) == got.text and all(e.token_ids == [] for e in deltas)
            s = got.stats
            assert s.prompt_tokens == want.stats.prompt_tokens and s.completion_tokens == want.stats.completion_tokens
            assert s.ttft_s > 0 and s.context_limit == 256
        again = remote_client.wait(remote_client.regenerate(rsid))
        assert again.text == got.text  # greedy: the same answer to the last message
    finally:
        local.engine.shutdown()


def test_a_plain_text_session_is_continued_not_answered(remote_client, bridge, server):
    """A raw (completion) session went upstream as one user message, so the endpoint's chat template answered the
    document where a local model continues it (found by helper AR: 14 prompt tokens where 6 went in)."""
    loaded = add_remote(remote_client, server.url, bridge.models[0].id)
    local = Client(EngineConfig(max_sessions=2, max_session_tokens=256))
    local.engine.start()
    try:
        lsid = local.open(local.load(bridge.models[0].info["source"]), params=GREEDY, raw=True)
        rsid = remote_client.open(loaded.model_id, params=GREEDY, raw=True)
        want, got = local.ask(lsid, "The capital of France is"), remote_client.ask(rsid, "The capital of France is")
        assert got.text == want.text and got.stats.prompt_tokens == want.stats.prompt_tokens
    finally:
        local.engine.shutdown()


def test_the_thinking_switch_reaches_the_endpoint(remote_client, bridge, server):
    """A chat's thinking switch goes upstream as chat_template_kwargs, which Parley's own server takes."""
    from dataclasses import replace

    from engine.remote import request_params

    assert request_params(replace(GREEDY, thinking=False))["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in request_params(GREEDY)
    windowed = request_params(replace(GREEDY, repetition_penalty=1.1, repeat_last_n=64))
    assert windowed["repetition_penalty"] == 1.1 and windowed["repeat_last_n"] == 64
    off = request_params(replace(GREEDY, repetition_penalty=1.1, presence_penalty=0.5, repeat_last_n=0))
    assert not {"repetition_penalty", "presence_penalty", "repeat_last_n"} & off.keys()  # a window of 0: none
    assert request_params(replace(GREEDY, logit_bias={7: -100.0}))["logit_bias"] == {"7": -100.0}  # OpenAI's own field
    assert "logit_bias" not in request_params(GREEDY)
    loaded = add_remote(remote_client, server.url, bridge.models[0].id)
    sid = remote_client.open(loaded.model_id, params=replace(GREEDY, thinking=False))
    answer = remote_client.ask(sid, "Hello there")
    assert answer.reason in ("stop", "length") and answer.text


def test_remote_cancel_and_close(remote_client, bridge, server):
    loaded = add_remote(remote_client, server.url, None)  # the endpoint's only model
    assert isinstance(loaded, ev.ModelLoaded) and loaded.name == bridge.models[0].id
    sid = remote_client.open(loaded.model_id, params=SamplingParams(max_tokens=200, stop=["\u2603\u2603"]))
    turn = remote_client.send(sid, "go on")
    remote_client.wait_for(lambda e: isinstance(e, ev.TokenDelta) and e.turn_id == turn)
    remote_client.engine.cancel(sid)
    end = remote_client.wait(turn, timeout=5)
    assert isinstance(end, ev.Finished) and end.reason == "cancelled"
    turn2 = remote_client.send(sid, "again")
    remote_client.wait_for(lambda e: isinstance(e, ev.TokenDelta) and e.turn_id == turn2)
    remote_client.engine.close(sid)
    end2 = remote_client.wait(turn2, timeout=5)
    assert isinstance(end2, ev.Finished) and end2.reason == "closed"


def test_unreachable_endpoint_fails_to_load(remote_client):
    failed = add_remote(remote_client, f"http://127.0.0.1:{free_port()}", "m", timeout=5)
    assert isinstance(failed, ev.ModelFailed) and "Cannot reach http://127.0.0.1" in failed.message


def test_wrong_key_and_unknown_model(remote_client, bridge, keyed_server):
    failed = add_remote(remote_client, keyed_server.url, bridge.models[0].id, key="wrong")
    assert isinstance(failed, ev.ModelFailed) and "refused the request (401)" in failed.message
    failed = add_remote(remote_client, keyed_server.url, "no-such-model", key=API_KEY)
    assert isinstance(failed, ev.ModelFailed) and "has no model 'no-such-model'" in failed.message
    ok = add_remote(remote_client, keyed_server.url, bridge.models[0].id, key=API_KEY)
    assert isinstance(ok, ev.ModelLoaded)


def test_a_stalled_answer_times_out_with_an_error(remote_client):
    with StallServer("stall") as stall:
        loaded = add_remote(remote_client, stall.url, MODEL, timeout=0.5)
        assert isinstance(loaded, ev.ModelLoaded) and loaded.info["context"] is None
        sid = remote_client.open(loaded.model_id, params=GREEDY)
        t0 = time.monotonic()
        end = remote_client.wait(remote_client.send(sid, "hello"), timeout=10)
        assert isinstance(end, ev.Error) and "did not answer within 0.5 s" in end.message
        assert time.monotonic() - t0 < 5
        again = remote_client.wait(remote_client.send(sid, "hello"), timeout=10)  # the session still works
        assert isinstance(again, ev.Error)


def test_a_stalled_model_list_times_out(remote_client):
    with StallServer("slow-models") as stall:
        failed = add_remote(remote_client, stall.url, MODEL, timeout=0.5)
        assert isinstance(failed, ev.ModelFailed) and "did not answer within 0.5 s" in failed.message


def test_a_dropped_connection_mid_answer_is_an_error(remote_client):
    with StallServer("drop") as drop:
        loaded = add_remote(remote_client, drop.url, MODEL, timeout=5)
        sid = remote_client.open(loaded.model_id, params=GREEDY)
        turn = remote_client.send(sid, "hello")
        end = remote_client.wait(turn, timeout=10)
        texts = [e.text for e in remote_client.by_turn[turn] if isinstance(e, ev.TokenDelta)]
        assert texts == ["Hel"] and isinstance(end, ev.Error) and "lost mid-answer" in end.message


def _ask(client: Client, url: str, timeout: float = 30) -> tuple[int, ev.Event, list[str]]:
    loaded = add_remote(client, url, MODEL, timeout=timeout)
    assert isinstance(loaded, ev.ModelLoaded), loaded
    sid = client.open(loaded.model_id, params=GREEDY)
    turn = client.send(sid, "hello")
    end = client.wait(turn, timeout=20)
    return sid, end, [e.text for e in client.by_turn[turn] if isinstance(e, ev.TokenDelta)]


def test_fields_of_the_wrong_type_are_read_as_absent_and_the_chat_stays_usable(remote_client):
    """A list of content parts, usage counts as text, a finish reason in a list, a lone surrogate: the turn hung
    (its end raised on the engine thread) and the chat answered "still answering" for ever."""
    with StallServer("typed") as typed:
        sid, end, texts = _ask(remote_client, typed.url)
        assert isinstance(end, ev.Finished) and end.reason == "stop" and end.text == "Hi\ufffd there"
        assert texts == ["Hi", "\ufffd there"] and end.stats.prompt_tokens == 0 and end.stats.completion_tokens == 2
        again = remote_client.wait(remote_client.send(sid, "again"), timeout=20)
        assert isinstance(again, ev.Finished)


def test_an_answer_with_its_finish_reason_ends_though_done_never_comes(remote_client):
    with StallServer("no-done") as held:
        t0 = time.monotonic()
        _, end, texts = _ask(remote_client, held.url)
        assert isinstance(end, ev.Finished) and end.text == "Hi" and end.reason == "stop"
        assert time.monotonic() - t0 < 10  # the grace, not the 30 s read timeout


def test_a_cancel_reaches_the_endpoint_at_once(remote_client):
    with StallServer("hold") as hold:
        loaded = add_remote(remote_client, hold.url, MODEL, timeout=30)
        sid = remote_client.open(loaded.model_id, params=GREEDY)
        turn = remote_client.send(sid, "hello")
        remote_client.wait_for(lambda e: isinstance(e, ev.TokenDelta) and e.turn_id == turn)
        remote_client.engine.cancel(sid)
        assert isinstance(remote_client.wait(turn, timeout=5), ev.Finished)
        assert hold.closed.wait(5)  # the connection ended (it waited for the 30 s read timeout)


def test_an_endpoint_that_ignores_max_tokens_is_cut_at_it(remote_client):
    with StallServer("forever") as forever:
        _, end, texts = _ask(remote_client, forever.url)
        assert isinstance(end, ev.Finished) and end.reason == "length" and len(texts) == GREEDY.max_tokens + 1
        assert forever.closed.wait(5)


def test_a_line_without_end_and_a_huge_model_list_are_refused_not_read_into_memory(remote_client):
    with StallServer("long-line") as long_line:
        _, end, _ = _ask(remote_client, long_line.url)
        assert isinstance(end, ev.Error) and "a line of over 1 MB" in end.message
    with StallServer("big-models") as big:
        failed = add_remote(remote_client, big.url, MODEL, timeout=30)
        assert isinstance(failed, ev.ModelFailed) and "more than 16 MB" in failed.message


def test_bad_url_is_refused_at_once(remote_client):
    with pytest.raises(ParleyError, match="not an http"):
        remote_client.engine.add_remote_model("ftp://example", "m")


def test_parley_serve_re_serves_a_remote_model(bridge, server):
    """`parley serve --remote URL#MODEL`: a second server whose model lives behind the first one."""
    import openai

    from server.bridge import ServerBridge
    from server.run import BackgroundServer

    front = ServerBridge(EngineConfig(max_sessions=2)).start()
    try:
        served = front.add_remote(server.url, bridge.models[0].id, timeout=30)
        assert served.context == 256 and served.info["remote"] is True
        with BackgroundServer(front) as s:
            c = openai.OpenAI(base_url=s.url, api_key="x", max_retries=0)
            direct = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
            kw = dict(model=served.id, messages=[{"role": "user", "content": "relay me"}], temperature=0, max_tokens=8)
            relayed = c.chat.completions.create(**kw)
            assert relayed.choices[0].message.content == direct.chat.completions.create(**kw).choices[0].message.content
            assert relayed.usage.completion_tokens >= 1
            with pytest.raises(openai.BadRequestError) as refused:  # the endpoint's error code is passed on
                c.chat.completions.create(**kw | {"messages": [{"role": "user", "content": "word " * 2000}]})
            assert refused.value.code == "context_length_exceeded", refused.value
            with pytest.raises(openai.BadRequestError, match="a remote model") as refused:  # said, not left null
                c.chat.completions.create(**kw | {"logprobs": True})
            assert refused.value.param == "logprobs"
            with pytest.raises(openai.BadRequestError, match="a remote model") as refused:  # its tokens are not masked here
                c.chat.completions.create(**kw | {"response_format": {"type": "json_object"}})
            assert refused.value.param == "response_format"
            with pytest.raises(openai.BadRequestError, match="needs a local model") as refused:  # ids of which vocabulary?
                c.completions.create(model=served.id, prompt=[1, 2, 3], max_tokens=4)
            assert refused.value.param == "prompt"
    finally:
        front.shutdown()


def test_an_endpoint_that_refuses_extension_fields_is_asked_again_without_them(monkeypatch):
    """OpenAI's own API answers 400 to top_k, min_p, repetition_penalty...: the app's default settings send some, so
    the turn is sent again without them (and later turns leave them out); other 400s stay errors."""
    import json
    import threading

    import httpx

    from engine.remote import RemoteError, RemoteModel

    bodies = []

    def strict(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        extra = sorted(set(body) & {"top_k", "min_p", "repetition_penalty", "repeat_last_n"})
        if extra:
            return httpx.Response(400, json={"error": {"message": f"Unrecognized request argument supplied: {extra[0]}",
                                                       "type": "invalid_request_error", "param": None}})
        if body["temperature"] > 1.5:
            return httpx.Response(400, json={"error": {"message": "temperature is too high", "param": "temperature"}})
        chunk = {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}
        return httpx.Response(200, text=f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    monkeypatch.setattr(RemoteModel, "_client", lambda self: httpx.Client(
        base_url=self.base_url, transport=httpx.MockTransport(strict)))
    remote = RemoteModel("http://strict.example", "gpt")
    app_like = SamplingParams(temperature=0.7, top_p=0.95, top_k=40, repetition_penalty=1.1, repeat_last_n=64)
    messages = [{"role": "user", "content": "hello"}]
    assert list(remote.stream_chat(messages, app_like, threading.Event())) == [("delta", "hi"), ("done", "stop", None)]
    assert "top_k" in bodies[0] and not {"top_k", "repetition_penalty", "repeat_last_n"} & bodies[1].keys()
    assert bodies[1]["temperature"] == 0.7 and bodies[1]["top_p"] == 0.95  # OpenAI's own fields stay
    list(remote.stream_chat(messages, app_like, threading.Event()))
    assert len(bodies) == 3 and "top_k" not in bodies[2]  # remembered: asked once
    with pytest.raises(RemoteError, match="temperature is too high"):
        list(remote.stream_chat(messages, SamplingParams(temperature=1.8), threading.Event()))


def test_a_key_beyond_ascii_or_pasted_with_its_line_end_reaches_the_endpoint(remote_client, bridge):
    """--remote-api-key clé failed before any request: "UnicodeEncodeError('ascii', 'Bearer clé', 9, 10, …)". It is
    sent in UTF-8 (as curl sends it, and as Parley's server reads it); a pasted key's line end is not part of it."""
    from server.run import BackgroundServer

    key = "clé-ключ"
    with BackgroundServer(bridge, api_key=key) as s:
        for given in (key, f" {key}\n"):
            loaded = add_remote(remote_client, s.url, bridge.models[0].id, key=given)
            assert isinstance(loaded, ev.ModelLoaded), getattr(loaded, "message", loaded)
