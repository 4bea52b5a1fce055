"""/v1/completions' `prompt` as token ids and as several prompts (what lm-evaluation-harness's `local-completions` and
batching clients send): ids answer as their text does, each prompt of an array as it would alone, choices prompt by
prompt (index p * n + i), and all of them in the same engine steps."""
from __future__ import annotations

import json

import httpx
import openai
import pytest


PROMPTS = ["Once upon a time", "The capital of France is", "def area(r):"]
GREEDY = {"model": "tiny", "max_tokens": 8, "temperature": 0}
SEEDED = {"model": "tiny", "max_tokens": 8, "temperature": 1.0, "seed": 7, "n": 2}


def _post(server, body: dict, path: str = "/completions") -> dict:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _streamed(server, body: dict) -> tuple[list[str], dict]:
    """Each choice's text joined from its chunks, by index, and the closing usage."""
    body = body | {"stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/completions", json=body, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    return [texts[i] for i in sorted(texts)], chunks[-1]["usage"]


def _texts(response: dict) -> list[str]:
    assert [c["index"] for c in response["choices"]] == list(range(len(response["choices"])))
    return [c["text"] for c in response["choices"]]


def test_token_ids_answer_as_their_text_does(server, bridge):
    """The tiny Qwen3 writes no BOS: its text's ids are the whole prompt, so both send the model the same tokens."""
    tok = bridge.models[0].tokenizer
    for prompt in PROMPTS:
        as_text = _post(server, GREEDY | {"prompt": prompt})
        as_ids = _post(server, GREEDY | {"prompt": tok.encode(prompt)})
        assert _texts(as_ids) == _texts(as_text) and as_ids["usage"] == as_text["usage"]
    echoed = _post(server, GREEDY | {"prompt": tok.encode(PROMPTS[-1]), "echo": True})  # the ids' text
    assert _texts(echoed) == [PROMPTS[-1] + _texts(as_text)[0]]


def test_a_bos_model_takes_the_ids_as_sent(bos_server):
    """As vLLM: a text prompt gets the model's BOS, ids go in as they are. The text's ids with their BOS answer as the
    text does; without it the model reads one token less (and answers as it will)."""
    server, tok = bos_server
    as_text = _post(server, GREEDY | {"prompt": PROMPTS[1]})
    ids = tok.encode(PROMPTS[1], add_bos=True)
    assert ids[0] == tok.bos_id
    with_bos = _post(server, GREEDY | {"prompt": ids})
    assert _texts(with_bos) == _texts(as_text) and with_bos["usage"] == as_text["usage"]
    without = _post(server, GREEDY | {"prompt": ids[1:]})
    assert without["usage"]["prompt_tokens"] == as_text["usage"]["prompt_tokens"] - 1
    echoed = _post(server, GREEDY | {"prompt": ids, "echo": True})  # decoded as sent: the BOS shows
    assert _texts(echoed)[0] == "<|begin_of_text|>" + PROMPTS[1] + _texts(as_text)[0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_several_prompts_answer_each_as_it_would_alone(server, bridge, stream):
    """n=2 each, seeded: prompt p's choice i is index p * n + i and draws from seed + i, as the prompt alone does; usage
    counts each prompt once and every answer. Strings and arrays of ids alike."""
    tok = bridge.models[0].tokenizer
    alone = [_post(server, SEEDED | {"prompt": p}) for p in PROMPTS]
    want = [t for a in alone for t in _texts(a)]
    usage = {k: sum(a["usage"][k] for a in alone) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    for prompts in (PROMPTS, [tok.encode(p) for p in PROMPTS]):
        if stream:
            texts, got_usage = _streamed(server, SEEDED | {"prompt": prompts})
        else:
            both = _post(server, SEEDED | {"prompt": prompts})
            texts, got_usage = _texts(both), both["usage"]
        assert texts == want and got_usage == usage
    assert bridge.open_sessions() == 0


def test_several_prompts_share_the_engines_steps(server, bridge):
    """Three prompts in one request decode together: every one has tokens before any has finished (one after
    another, the first would finish before the second began)."""
    from engine import events as ev

    seen = len(bridge.seen)
    _post(server, GREEDY | {"prompt": PROMPTS, "max_tokens": 12})
    events = [e for e in bridge.seen[seen:] if isinstance(e, (ev.TokenDelta, ev.Finished))]
    sessions = {e.session_id for e in events}
    first_end = next(k for k, e in enumerate(events) if isinstance(e, ev.Finished))
    assert len(sessions) == 3 and {e.session_id for e in events[:first_end]} == sessions


def test_best_of_ranks_each_prompts_answers_on_their_own(server):
    body = SEEDED | {"n": 1, "best_of": 3}
    alone = [_texts(_post(server, body | {"prompt": p}))[0] for p in PROMPTS[:2]]
    assert _texts(_post(server, body | {"prompt": PROMPTS[:2]})) == alone


def test_openai_client_sends_prompt_arrays(server, bridge):
    tok = bridge.models[0].tokenizer
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
    kw = dict(model="tiny", max_tokens=8, temperature=0)
    alone = [client.completions.create(prompt=p, **kw).choices[0].text for p in PROMPTS]
    for prompts in (PROMPTS, [tok.encode(p) for p in PROMPTS]):
        got = client.completions.create(prompt=prompts, **kw)
        assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == alone
