"""`n` choices: one session each, batched in the same steps; each choice is the answer its own request would get."""
from __future__ import annotations

import json
import time

import httpx
import openai

from engine import events as ev
from tests.server.test_openai_server import client

MESSAGES = [{"role": "user", "content": "Write a short line about rivers."}]


def test_seeded_choices_are_the_answers_of_seeds_seed_plus_one_and_so_on(server, bridge):
    c = client(server)
    kw = dict(model="tiny", messages=MESSAGES, temperature=1.0, max_tokens=12)
    many = c.chat.completions.create(n=4, seed=41, **kw)
    alone = [c.chat.completions.create(seed=41 + i, **kw) for i in range(4)]
    assert [ch.index for ch in many.choices] == [0, 1, 2, 3]
    assert [ch.message.content for ch in many.choices] == [a.choices[0].message.content for a in alone]
    assert [ch.finish_reason for ch in many.choices] == [a.choices[0].finish_reason for a in alone]
    assert len({ch.message.content for ch in many.choices}) > 1  # not one draw four times
    assert many.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert many.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert bridge.open_sessions() == 0


def test_streamed_choices_each_get_their_role_text_and_end(server, bridge):
    c = client(server)
    kw = dict(model="tiny", messages=MESSAGES, temperature=0.8, seed=3, max_tokens=10)
    whole = c.chat.completions.create(n=3, **kw)
    parts, roles, reasons, usage = {}, {}, {}, None
    for chunk in c.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **kw):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            parts[ch.index] = parts.get(ch.index, "") + (ch.delta.content or "")
            roles[ch.index] = roles.get(ch.index) or ch.delta.role
            if ch.finish_reason:
                assert ch.index not in reasons, "a choice ended twice"
                reasons[ch.index] = ch.finish_reason
    assert [parts[i] for i in range(3)] == [ch.message.content for ch in whole.choices]
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert [reasons[i] for i in range(3)] == [ch.finish_reason for ch in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert bridge.open_sessions() == 0


def test_more_choices_than_cache_slots_queue_and_all_come_back(server, bridge):
    """12 choices on 8 slots: the last four wait for slots, then answer; greedy choices are all the one answer."""
    r = httpx.post(server.url + "/completions", timeout=60, json={
        "model": "tiny", "prompt": "Rivers run to the", "n": 12, "temperature": 0, "max_tokens": 6})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    alone = client(server).completions.create(model="tiny", prompt="Rivers run to the", temperature=0, max_tokens=6)
    assert [ch["index"] for ch in choices] == list(range(12))
    assert {ch["text"] for ch in choices} == {alone.choices[0].text}
    assert bridge.open_sessions() == 0


def test_a_client_that_leaves_cancels_every_choice(server, bridge):
    seen_before = len(bridge.seen)
    with httpx.stream("POST", server.url + "/chat/completions", timeout=30, json={
            "model": "tiny", "messages": MESSAGES, "stream": True, "n": 3, "temperature": 0.7, "seed": 1,
            "max_tokens": 250, "stop": ["never appears in output \u2603"]}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break  # a choice got a token: hang up
    deadline = time.monotonic() + 10
    while len(ends := [e for e in bridge.seen[seen_before:] if isinstance(e, ev.Finished)]) < 3:
        assert time.monotonic() < deadline, f"{len(ends)} of 3 turns ended"
        time.sleep(0.02)
    assert all(e.reason in ("cancelled", "closed") and e.stats.completion_tokens < 250 for e in ends)
    assert bridge.open_sessions() == 0


def test_a_refused_prompt_refuses_the_request_once(server, bridge):
    try:
        client(server).chat.completions.create(model="tiny", n=3, max_tokens=4,
                                               messages=[{"role": "user", "content": "word " * 2000}])
    except openai.BadRequestError as exc:
        assert "context" in str(exc)
    else:
        raise AssertionError("a prompt over the context was answered")
    assert bridge.open_sessions() == 0
