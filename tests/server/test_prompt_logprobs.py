"""/v1/completions with `echo` and `logprobs` (lm-evaluation-harness's loglikelihood requests): the prompt's own
log-probabilities in vLLM's legacy shape, the first token's null, before the answer's; `max_tokens: 0` with `echo`
sends the prompt alone."""
from __future__ import annotations

import httpx
import pytest

BODY = {"model": "tiny", "temperature": 0, "echo": True, "logprobs": 2}


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/completions", json=body, timeout=60)


def _ok(server, body: dict) -> dict:
    r = _post(server, body)
    assert r.status_code == 200, r.text
    return r.json()


def _ids(bridge, text: str) -> list[int]:
    """The model's ids for `text` with its BOS, as a text prompt runs."""
    return bridge.models[0].tokenizer.encode(text, add_bos=True)


def test_the_prompt_alone_scored_in_the_legacy_shape(server, bridge):
    ids = _ids(bridge, "The capital of France is Paris.")
    out = _ok(server, BODY | {"prompt": ids, "max_tokens": 0})
    (choice,) = out["choices"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v < 0 for v in lp["token_logprobs"][1:])
    assert all(0 < len(top) <= 2 and max(top.values()) >= v for top, v in zip(lp["top_logprobs"][1:],
                                                                               lp["token_logprobs"][1:]))
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert choice["text"] == bridge.models[0].tokenizer.decode(ids)  # the prompt, nothing after it
    assert choice["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}


def test_a_continuation_scores_as_the_answer_it_was(server, bridge):
    """The tokens a greedy answer made, echoed back as prompt, get the numbers they had as the answer's."""
    ids = _ids(bridge, "Once upon a time")
    answer = _ok(server, {"model": "tiny", "prompt": ids, "max_tokens": 6, "temperature": 0, "logprobs": 0})
    made = answer["choices"][0]["logprobs"]["token_logprobs"]
    scored = _ok(server, BODY | {"prompt": [ids + _made_ids(server, bridge, ids, 6)], "max_tokens": 0})
    echoed = scored["choices"][0]["logprobs"]["token_logprobs"][len(ids):]
    assert len(echoed) == len(made) and all(abs(a - b) < 1e-4 for a, b in zip(echoed, made))


def _made_ids(server, bridge, ids: list[int], n: int) -> list[int]:
    """The ids of a greedy answer of `n` tokens (the engine's own events: the text would tokenise otherwise)."""
    seen = len(bridge.seen)
    _ok(server, {"model": "tiny", "prompt": ids, "max_tokens": n, "temperature": 0})
    return [t for e in bridge.seen[seen:] if type(e).__name__ == "TokenDelta" for t in e.token_ids]


def test_echo_scores_the_prompt_then_the_answer(server, bridge):
    ids = _ids(bridge, "def area(r):")
    out = _ok(server, BODY | {"prompt": [ids, ids[:4]], "max_tokens": 3})
    for choice, prompt in zip(out["choices"], [ids, ids[:4]]):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(prompt) + 3 and lp["token_logprobs"][0] is None
        assert choice["text"] == "".join(lp["tokens"])  # an id prompt's echo is its ids' text: the offsets fit it
        assert lp["text_offset"] == [sum(map(len, lp["tokens"][:k])) for k in range(len(lp["tokens"]))]
    assert out["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("fields,param,words", [
    ({"echo": False, "max_tokens": 0}, "max_tokens", "between 1 and"),
    ({"stream": True, "max_tokens": 2}, "stream", "cannot stream"),
    ({"logprobs": None, "stream": True, "max_tokens": 0}, "stream", "cannot stream"),
])
def test_what_cannot_be_answered_is_a_400(server, fields, param, words):
    r = _post(server, BODY | {"prompt": "hello"} | fields)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert words in r.json()["error"]["message"]


def test_an_end_of_turn_answer_keeps_its_entry(server, bridge):
    """lm-evaluation-harness sends max_tokens 1 and drops the last entry as the answer's: an answer that is the
    end-of-turn token (forced here by a bias) must still have one, else a prompt token would be dropped."""
    ids = _ids(bridge, "The end.")
    stop = next(iter(bridge.models[0].tokenizer.stop_ids))
    out = _ok(server, BODY | {"prompt": ids, "max_tokens": 1, "logprobs": 1, "logit_bias": {str(stop): 100}})
    lp = out["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1 and out["choices"][0]["finish_reason"] == "stop"
