"""`parley serve` driven by the official openai client, unchanged: streaming, concurrency, sampling, usage."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from engine import events as ev
from engine.sampling import SamplingParams
from tests.server.conftest import API_KEY

PROMPTS = [f"Prompt number {i}: {w}" for i, w in enumerate(
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split())]


def client(server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=60)


def stream_text(c: openai.OpenAI, prompt: str, **kw) -> tuple[str, str, object]:
    kw = {"temperature": 0, "max_tokens": 16} | kw
    parts, reason, usage = [], None, None
    stream = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}], stream=True,
                                       stream_options={"include_usage": True}, **kw)
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reason = choice.finish_reason or reason
    return "".join(parts), reason, usage


def test_models_lists_the_served_model(server, bridge):
    c = client(server)
    ids = [m.id for m in c.models.list()]
    assert ids == [bridge.models[0].id]
    assert c.models.retrieve("tiny").id == ids[0]  # the alias given at load works too
    assert c.models.retrieve("qwen3-f32").id == ids[0]  # and the file's name, with or without its extension
    assert c.models.retrieve("qwen3-f32.gguf").id == ids[0]


def test_sixteen_concurrent_streams_equal_one_at_a_time(server, bridge):
    c = client(server)
    alone = [stream_text(c, p) for p in PROMPTS]
    with ThreadPoolExecutor(16) as pool:  # 16 clients, 8 cache slots: half of them queue
        together = list(pool.map(lambda p: stream_text(client(server), p), PROMPTS))
    assert [t for t, _, _ in together] == [t for t, _, _ in alone]
    assert all(t for t, _, _ in alone) and len({t for t, _, _ in alone}) > 1
    for _, reason, usage in together:
        assert reason in ("stop", "length") and usage.completion_tokens >= 1 and usage.prompt_tokens > 5
    assert any(isinstance(e, ev.Queued) for e in bridge.seen)
    assert bridge.open_sessions() == 0


def test_non_streaming_matches_streaming_and_fills_usage(server):
    c = client(server)
    text, reason, usage = stream_text(c, PROMPTS[3])
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[3]}],
                                  temperature=0, max_completion_tokens=16)
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == reason
    assert r.usage.prompt_tokens == usage.prompt_tokens and r.usage.completion_tokens == usage.completion_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    short = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=0,
                                      max_tokens=3, stop=[])
    assert short.usage.completion_tokens <= 3


def test_messages_are_replayed_as_the_conversation(server, bridge):
    """A request carrying system + earlier turns answers like a session that lived through those turns."""
    c = client(server)
    eng = bridge.engine
    first = c.chat.completions.create(model="tiny", temperature=0, max_tokens=10, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]).choices[0].message.content
    replayed = c.chat.completions.create(model="tiny", temperature=0, max_tokens=10, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": first}, {"role": "user", "content": [{"type": "text", "text": "And then?"}]},
    ]).choices[0].message.content
    sid = eng.open_session(bridge.models[0].model_id)
    assert _run_turns(bridge, sid, ["Hi there", "And then?"], SamplingParams(max_tokens=10), "Be brief.") == [first, replayed]


def _run_turns(bridge, sid: int, texts: list[str], params: SamplingParams, system: str | None) -> list[str]:
    """Lives through the turns as an app would: the conversation is kept here, each turn hands over all of it."""
    messages: list[dict[str, str]] = []
    out = []
    for text in texts:
        messages.append({"role": "user", "content": text})
        turn = bridge.engine.submit(sid, messages, params, system)
        deadline = time.monotonic() + 60
        while not any(isinstance(e, ev.Finished) and e.turn_id == turn for e in bridge.seen):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        answer = next(e.text for e in bridge.seen if isinstance(e, ev.Finished) and e.turn_id == turn)
        messages.append({"role": "assistant", "content": answer})
        out.append(answer)
    bridge.engine.close(sid)
    return out


def test_raw_completions_stream_and_not(server):
    c = client(server)
    whole = c.completions.create(model="tiny", prompt="The capital of France is", temperature=0, max_tokens=12)
    parts = [ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt="The capital of France is", temperature=0, max_tokens=12, stream=True) if ch.choices]
    assert "".join(parts) == whole.choices[0].text and whole.usage.completion_tokens >= 1
    assert whole.object == "text_completion"


def test_stop_strings_and_seeded_sampling(server):
    c = client(server)
    text, _, _ = stream_text(c, PROMPTS[5], max_tokens=24)
    cut = text[len(text) // 2:][:3]
    assert cut.strip(), text
    stopped, reason, _ = stream_text(c, PROMPTS[5], max_tokens=24, stop=[cut])
    assert stopped == text[: text.index(cut)] and reason == "stop"
    kw = dict(temperature=0.9, top_p=0.95, seed=7, max_tokens=16, presence_penalty=0.5, frequency_penalty=0.2,
              extra_body={"top_k": 40, "min_p": 0.01, "repetition_penalty": 1.1, "repeat_last_n": 64})
    a, b = stream_text(c, PROMPTS[6], **kw), stream_text(c, PROMPTS[6], **kw)
    assert a[0] == b[0]


def test_client_disconnect_cancels_the_turn(server, bridge):
    seen_before = len(bridge.seen)
    with httpx.stream("POST", server.url + "/chat/completions", timeout=30, json={
            "model": "tiny", "messages": [{"role": "user", "content": "go on forever"}], "stream": True,
            "temperature": 0.0, "max_tokens": 250, "stop": ["never appears in output \u2603"]}) as r:
        for line in r.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                break  # got a token: hang up
    deadline = time.monotonic() + 10
    while True:
        ends = [e for e in bridge.seen[seen_before:] if isinstance(e, ev.Finished)]
        if ends:
            break
        assert time.monotonic() < deadline, "the turn did not end"
        time.sleep(0.02)
    assert ends[0].reason in ("cancelled", "closed") and ends[0].stats.completion_tokens < 250
    assert bridge.open_sessions() == 0


def test_api_key_is_required_when_set(keyed_server):
    with pytest.raises(openai.AuthenticationError):
        client(keyed_server, "wrong").models.list()
    r = httpx.get(keyed_server.url + "/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    text, _, _ = stream_text(client(keyed_server, API_KEY), PROMPTS[0])
    assert text


def test_an_answer_last_is_continued_and_only_its_new_text_comes_back(server, bridge):
    """A prefilled answer (SillyTavern's continue, llama.cpp's server): the reply is the text after it."""
    c = client(server)
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    reply = c.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=6)
    text = reply.choices[0].message.content
    finished = [e for e in bridge.seen if isinstance(e, ev.Finished)][-1]
    assert text and finished.text == "The colour is" + text
    parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_tokens=6, stream=True) if ch.choices]
    assert "".join(parts) == text
    asked = c.chat.completions.create(model="tiny", temperature=0, max_tokens=6,
                                      messages=[*messages[:1], {"role": "assistant", "content": ""}])
    assert asked.choices[0].message.content == c.chat.completions.create(
        model="tiny", messages=messages[:1], temperature=0, max_tokens=6).choices[0].message.content


def test_openai_field_conventions(server):
    """n null, a negative seed (llama.cpp's -1: random; others a fixed seed), one `created` per stream with
    "usage": null on every chunk but the last, 16 tokens for a completion without max_tokens, the list at
    /v1/models/, a 405 naming what is allowed."""
    c = client(server)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    assert httpx.post(server.url + "/chat/completions", json=body | {"n": None}, timeout=30).status_code == 200
    seeded = [c.chat.completions.create(**body, temperature=1.0, seed=-5).choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1]
    assert httpx.post(server.url + "/chat/completions", json=body | {"seed": -1}, timeout=30).status_code == 200
    chunks = list(c.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    assert len({ch.created for ch in chunks}) == 1
    raw = httpx.post(server.url + "/chat/completions", timeout=30,
                     json=body | {"stream": True, "stream_options": {"include_usage": True}}).text
    events = [line for line in raw.splitlines() if line.startswith("data: {")]
    assert all('"usage": null' in line for line in events[:-1]) and '"usage": {' in events[-1]
    done = c.completions.create(model="tiny", prompt="Once upon a time", temperature=0)
    assert done.usage.completion_tokens <= 16
    assert httpx.get(server.url + "/models/", timeout=30).json()["object"] == "list"
    wrong = httpx.get(server.url + "/chat/completions", timeout=30)
    assert wrong.status_code == 405 and "POST" in wrong.headers.get("allow", "")


def test_a_lone_surrogate_in_the_model_name_is_a_400_not_a_dropped_connection(server):
    """Since 33473da a lone surrogate anywhere in a request's JSON is a 400 naming it (it was a 404 naming the model)."""
    with httpx.Client(timeout=30) as http:
        r = http.post(server.url + "/chat/completions", content=b'{"model": "\\ud800x", "messages": []}',
                      headers={"content-type": "application/json"})
        assert r.status_code == 400 and "\\\\ud800" in r.text and "surrogate" in r.text
        assert http.get(server.url + "/models").status_code == 200  # the same connection goes on


def test_a_continued_answer_s_reply_starts_where_its_trimmed_prompt_ended():
    """The engine joins the new text to the answer without its trailing whitespace where the template trimmed it; the
    reply is still only the new text (it did read back the whole answer, prefix included)."""
    from types import SimpleNamespace

    from server.app import _new_text

    req = SimpleNamespace(continue_final=True, prompt="The sea is wide.\n\n")
    assert _new_text("The sea is wide.\nIt is blue.", req) == "\nIt is blue."
    assert _new_text("The sea is wide.\n\nIt is blue.", req) == "It is blue."
