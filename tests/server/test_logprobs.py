"""`logprobs` on both endpoints: each chosen token's log-probability and its most likely alternatives, in OpenAI's
shapes, streamed and not, per choice; counts out of range refused with a 400 that names the field."""
from __future__ import annotations

import json

import httpx
import pytest

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6, "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}


def _post(server, body: dict, path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def _stream(server, body: dict, path: str = "/chat/completions") -> list[dict]:
    with httpx.stream("POST", server.url + path, json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def _tokens(entries: list[dict]) -> list:
    return [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in entries]


def _numbers(entries: list[dict]) -> list[float]:
    return [v for e in entries for v in (e["logprob"], *(t["logprob"] for t in e["top_logprobs"]))]


def _close(a: list[float], b: list[float]) -> bool:
    """Equal within float32 rounding: a prompt read from the prefix cache computes its last logits in a step of
    another size, whose products may differ in their last bit on this float model (the tokens do not)."""
    return len(a) == len(b) and all(abs(x - y) < 1e-5 for x, y in zip(a, b))


def test_chat_logprobs_rank_the_chosen_token_and_its_alternatives(server):
    r = _post(server, CHAT | {"logprobs": True, "top_logprobs": 3})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    entries = choice["logprobs"]["content"]
    assert len(entries) == r.json()["usage"]["completion_tokens"] == 6
    assert "".join(e["token"] for e in entries) == choice["message"]["content"]
    for e in entries:
        top = e["top_logprobs"]
        assert len(top) == 3 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert (top[0]["token"], top[0]["logprob"]) == (e["token"], e["logprob"])  # greedy: the most likely one
        assert e["logprob"] <= 0 and e["bytes"] == list(e["token"].encode())
    without = _post(server, CHAT).json()["choices"][0]
    assert without["logprobs"] is None and without["message"] == choice["message"]


def test_streamed_logprobs_are_those_of_the_whole_answer(server):
    whole = _post(server, CHAT | {"logprobs": True, "top_logprobs": 2}).json()["choices"][0]["logprobs"]["content"]
    chunks = _stream(server, CHAT | {"logprobs": True, "top_logprobs": 2})
    streamed = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert _tokens(streamed) == _tokens(whole) and _close(_numbers(streamed), _numbers(whole))
    assert all(ch["logprobs"] is None for c in chunks for ch in c["choices"] if not ch["delta"].get("content"))


def test_a_completions_logprobs_are_parallel_lists_with_offsets(server):
    r = _post(server, COMPLETION | {"logprobs": 2}, "/completions")
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 6
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(6)]
    assert all(len(top) <= 2 and top[tok] == value
               for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]))
    chunks = _stream(server, COMPLETION | {"logprobs": 2}, "/completions")
    parts = [ch["logprobs"] for c in chunks for ch in c["choices"] if ch["logprobs"]]
    assert [t for p in parts for t in p["tokens"]] == lp["tokens"]
    assert [o for p in parts for o in p["text_offset"]] == lp["text_offset"]  # offsets go on across chunks
    zero = _post(server, COMPLETION | {"logprobs": 0}, "/completions").json()["choices"][0]["logprobs"]
    assert _close(zero["token_logprobs"], lp["token_logprobs"])
    assert zero["top_logprobs"] == [{tok: v} for tok, v in zip(zero["tokens"], zero["token_logprobs"])]  # chosen alone


def test_each_choice_has_its_own_logprobs(server):
    r = _post(server, CHAT | {"n": 3, "temperature": 1.0, "seed": 5, "logprobs": True})
    choices = r.json()["choices"]
    texts = [c["message"]["content"] for c in choices]
    assert len(set(texts)) > 1  # three draws, not one
    for c in choices:
        assert "".join(e["token"] for e in c["logprobs"]["content"]) == c["message"]["content"]


@pytest.mark.parametrize("path, fields, param", [
    ("/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true (OpenAI's rule)
    ("/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/chat/completions", {"logprobs": 1}, "logprobs"),
    ("/completions", {"logprobs": 21}, "logprobs"),
    ("/completions", {"logprobs": "2"}, "logprobs"),
    ("/completions", {"logprobs": 2, "top_logprobs": 2}, "top_logprobs"),
])
def test_counts_out_of_range_are_refused_naming_the_field(server, path, fields, param):
    body = (CHAT if path == "/chat/completions" else COMPLETION) | fields
    r = _post(server, body, path)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
