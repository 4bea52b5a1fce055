"""How big a request may be, and that one too big is refused before its items are read (issue 23's round 3): a
prompt of token ids past the context, millions of prompts, a body of millions of small arrays."""
from __future__ import annotations

import gc

import httpx
import pytest

from engine import events as ev
from engine.sampling import MAX_BIASED
from server import protocol as api
from server.api_error import APIError
from server.prompts import MAX_ANSWERS, completion_prompts


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/completions", json=body, timeout=60)


def test_an_id_prompt_past_the_context_is_refused_before_a_session_opens(server, bridge):
    """The length is the bound: 4M ids were read one by one (0.65 s) and then sent to the engine, whose thread read
    them twice more before it refused them (1.4-2.1 s in all, every stream beside it stalled)."""
    context = bridge.models[0].context
    since = len(bridge.seen)
    for prompt, param in (([1] * context, "prompt"), ([[1], [1] * (context + 5)], "prompt[1]")):
        r = _post(server, {"model": "tiny", "prompt": prompt, "max_tokens": 1})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == param, r.text
        assert f"needs {len(prompt[-1]) if param != 'prompt' else context:,} tokens" in err["message"]
    assert not [e for e in bridge.seen[since:] if e.session_id is not None], bridge.seen[since:]


def test_sizes_are_checked_before_items():
    """A prompt of ids past the context, or more prompts than answers a request makes, is refused for its size
    whatever its items hold (none of them is read)."""
    with pytest.raises(APIError, match="context holds 8") as refused:
        completion_prompts([1] * 8 + [-1], 8)
    assert refused.value.code == "context_length_exceeded"
    with pytest.raises(APIError, match=f"{MAX_ANSWERS + 1:,} prompts"):
        completion_prompts([[1]] * MAX_ANSWERS + [[-1]], 8)


@pytest.mark.parametrize("wrong", [-2, True, 1.5, "1", None, [1]])
def test_every_kind_of_wrong_id_is_named(wrong):
    with pytest.raises(APIError, match="not a token id") as refused:
        completion_prompts([3, 1, wrong, 2], 64)
    assert refused.value.param == "prompt"


def test_a_body_of_many_small_arrays_is_parsed_without_a_collection():
    """JSON makes no cycles; the collector's full passes over a body's million small arrays were 3/4 of the parse
    (8 MB of [1] arrays: 1.6 s, the event loop and every stream held)."""
    body = b'{"prompt": [' + b",".join([b"[1]"] * 300_000) + b"]}"
    collections = []

    def seen(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        data = api.parse_json(body)
    finally:
        gc.callbacks.remove(seen)
    assert len(data["prompt"]) == 300_000 and collections == [] and gc.isenabled()


def test_a_logit_bias_of_too_many_tokens_is_refused_before_its_entries_are_read():
    """600,000 entries were each checked (0.4 s of the event loop, every stream held) before their count was."""
    bias = {str(i): 1 for i in range(MAX_BIASED)} | {"x": "not read"}
    with pytest.raises(APIError, match=f"at most {MAX_BIASED} tokens, not {MAX_BIASED + 1}"):
        api.parse_chat({"messages": [{"role": "user", "content": "hi"}], "logit_bias": bias}, 64)
