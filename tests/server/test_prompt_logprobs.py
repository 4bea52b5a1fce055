"""/v1/completions with `echo` and `logprobs` (lm-evaluation-harness's loglikelihood requests): the prompt's own
log-probabilities in vLLM's legacy shape, the first token's null, before the answer's; `max_tokens: 0` with `echo`
sends the prompt alone."""
from __future__ import annotations

import json

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
    assert all(0 < len(top) <= 3 and max(top.values()) >= v for top, v in zip(lp["top_logprobs"][1:],
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


def test_max_tokens_0_without_echo_is_a_400(server):
    r = _post(server, BODY | {"prompt": "hello", "echo": False, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    assert "between 1 and" in r.json()["error"]["message"]


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_streamed_as_sent_whole(server, bridge, max_tokens):
    """The echo chunk carries the prompt's entries, the answer's chunks theirs after it (offsets running on); joined,
    the text and every list are the whole answer's."""
    body = BODY | {"prompt": [_ids(bridge, "Once upon a time"), _ids(bridge, "def f(x):")], "max_tokens": max_tokens}
    whole = _ok(server, body)
    with httpx.stream("POST", server.url + "/completions", json=body | {"stream": True}, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    for choice in whole["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == choice["index"]]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert mine[-1]["finish_reason"] == choice["finish_reason"]
        streamed = {key: [v for c in mine if c["logprobs"] for v in c["logprobs"][key]] for key in choice["logprobs"]}
        for key in ("tokens", "text_offset"):
            assert streamed[key] == choice["logprobs"][key]
        # the two requests' steps may group the prompts apart (each renders on its own worker): float32 rows then
        # differ in their last bits
        numbers = zip(streamed["token_logprobs"], choice["logprobs"]["token_logprobs"])
        assert all(a is b is None or abs(a - b) < 1e-5 for a, b in numbers)
        assert [t and list(t) for t in streamed["top_logprobs"]] == [t and list(t) for t in choice["logprobs"][
            "top_logprobs"]]


def test_an_end_of_turn_answer_keeps_its_entry(server, bridge):
    """lm-evaluation-harness sends max_tokens 1 and drops the last entry as the answer's: an answer that is the
    end-of-turn token (forced here by a bias) must still have one, else a prompt token would be dropped."""
    ids = _ids(bridge, "The end.")
    stop = next(iter(bridge.models[0].tokenizer.stop_ids))
    out = _ok(server, BODY | {"prompt": ids, "max_tokens": 1, "logprobs": 1, "logit_bias": {str(stop): 100}})
    lp = out["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1 and out["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_every_choice_of_an_end_of_turn_answer_keeps_its_entry(server, bridge, stream):
    """Of n choices only the first scores the prompt (the others are sent its entries), and the engine listed the
    end-of-turn token only where its sequence scored the prompt: the second choice lacked its entry. Every choice of
    an echo lists it."""
    ids = _ids(bridge, "The end.")
    stop = next(iter(bridge.models[0].tokenizer.stop_ids))
    body = BODY | {"prompt": ids, "max_tokens": 1, "logprobs": 1, "logit_bias": {str(stop): 100}, "n": 2}
    if stream:
        with httpx.stream("POST", server.url + "/completions", json=body | {"stream": True}, timeout=60) as r:
            chunks = [json.loads(line[6:])["choices"][0] for line in r.iter_lines() if line.startswith("data: {")]
        lists = [[v for c in chunks if c["index"] == i and c["logprobs"] for v in c["logprobs"]["token_logprobs"]]
                 for i in range(2)]
        reasons = [c["finish_reason"] for c in chunks if c["finish_reason"]]
    else:
        choices = _ok(server, body)["choices"]
        lists, reasons = [c["logprobs"]["token_logprobs"] for c in choices], [c["finish_reason"] for c in choices]
    assert [len(lp) for lp in lists] == [len(ids) + 1] * 2 and reasons == ["stop"] * 2, lists
    # forced, and the same prompt: the same number, up to the float order of the two choices' different steps
    assert lists[1][-1] == pytest.approx(lists[0][-1], rel=1e-5) and lists[0][-1] < 0


@pytest.mark.parametrize("echo", [True, False])
def test_every_choice_carries_the_requests_echo(echo):
    """Choices past the first drop prompt_logprobs (the first scores the prompt for all): their echo is the request's,
    set by parse_completion rather than left to SamplingParams deriving it from prompt_logprobs."""
    from server.protocol import parse_completion

    req = parse_completion({"prompt": "x", "n": 3, "logprobs": 1, "echo": echo}, 256)
    assert [req.choice_params(i).echo for i in range(3)] == [echo] * 3
    assert [req.choice_params(i).prompt_logprobs for i in range(3)] == [1 if echo else None, None, None]


def test_without_echo_no_choice_lists_its_end_of_turn_token(server, bridge):
    """OpenAI lists no entry for the end-of-turn token an answer ends with: n choices without echo, each answer that
    token alone (forced by a bias), have none."""
    stop = next(iter(bridge.models[0].tokenizer.stop_ids))
    body = BODY | {"prompt": _ids(bridge, "The end."), "echo": False, "max_tokens": 1, "logprobs": 1,
                   "logit_bias": {str(stop): 100}, "n": 2}
    choices = _ok(server, body)["choices"]
    assert [c["logprobs"]["tokens"] for c in choices] == [[], []] and [c["finish_reason"] for c in choices] == ["stop"] * 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_text_prompts_offsets_count_in_the_text_sent(bos_server, stream):
    """The BOS put before a text prompt is listed but is no text of the echo: the first token sent is at offset 0 and
    every written token's offset is where its text is in the choice's text (OpenAI's; lm-evaluation-harness reads
    the lists by index, a client that cuts the text by offset reads these)."""
    server, tok = bos_server
    prompt = "The capital of France is"
    body = BODY | {"prompt": prompt, "max_tokens": 3}
    if stream:
        with httpx.stream("POST", server.url + "/completions", json=body | {"stream": True}, timeout=60) as r:
            choices = [json.loads(line[6:])["choices"][0] for line in r.iter_lines() if line.startswith("data: {")]
        text = "".join(c["text"] for c in choices)
        lp = {key: [v for c in choices if c["logprobs"] for v in c["logprobs"][key]]
              for key in ("tokens", "text_offset")}
    else:
        (choice,) = _ok(server, body)["choices"]
        text, lp = choice["text"], choice["logprobs"]
    assert text.startswith(prompt) and lp["tokens"][0] == tok.decode([tok.bos_id]) and lp["text_offset"][:2] == [0, 0]
    assert all(text[at : at + len(token)] == token for token, at in zip(lp["tokens"][1:], lp["text_offset"][1:]))


def test_each_scored_token_is_among_its_top_logprobs(server, bridge):
    """OpenAI's legacy lists hold the chosen token beside the `logprobs` most likely (up to logprobs + 1), as vLLM's:
    a prompt token the model did not expect is there too, with its own number."""
    out = _ok(server, BODY | {"prompt": _ids(bridge, "Purple elephants compute taxes"), "max_tokens": 0, "logprobs": 1})
    lp = out["choices"][0]["logprobs"]
    pairs = list(zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]))
    assert any(len(top) == 2 for _, _, top in pairs)  # a token outside the top one: the case this is about
    assert all(top[token] == value and len(top) <= 2 and max(top.values()) == next(iter(top.values()))
               for token, value, top in pairs)


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_score_the_prompt_once_and_share_its_entries(server, bridge, stream):
    """Each of a prompt's n choices scored it in a prefill of its own (n = 4 on Gemma 3 270M, 601 tokens: 5.4 times
    one choice's time); the first scores it, the others copy its cache and are sent its entries."""
    ids = _ids(bridge, "Once upon a time there was a little fox who lived in the woods near a river, and every day")
    body = BODY | {"prompt": ids, "max_tokens": 2, "n": 3, "temperature": 1.0, "seed": 3}
    seen = len(bridge.seen)
    if stream:
        with httpx.stream("POST", server.url + "/completions", json=body | {"stream": True}, timeout=60) as r:
            chunks = [json.loads(line[6:])["choices"][0] for line in r.iter_lines() if line.startswith("data: {")]
        lists = [[v for c in chunks if c["index"] == i and c["logprobs"] for v in c["logprobs"]["token_logprobs"]]
                 for i in range(3)]
    else:
        lists = [c["logprobs"]["token_logprobs"] for c in _ok(server, body)["choices"]]
    assert all(len(lp) >= len(ids) and lp[:len(ids)] == lists[0][:len(ids)] for lp in lists), lists
    ends = [e for e in bridge.seen[seen:] if type(e).__name__ == "Finished"]
    assert len(ends) == 3 and sum(e.stats.prefilled_tokens for e in ends) < 2 * len(ids), [e.stats for e in ends]


def test_a_choice_that_runs_ahead_of_its_prompts_entries_waits_for_them():
    """Where a prompt's other choices do not wait for its first one's prefill (a prompt shorter than the engine's
    follow threshold), their events are held until its entries come, then read again: every echo carries them."""
    from collections import deque

    from engine import events as ev
    from engine.logprobs import NamedLogprob
    from server.prompt_logprobs import SharedEcho

    entries = [NamedLogprob("a", None), NamedLogprob("b", -1.0)]
    share, held = SharedEcho(made=2), deque()
    early = ev.TokenDelta(2, 1, [5], "x")
    assert share.waits(1, early) and not held  # choice 1 came first: it waits
    first = ev.TokenDelta(1, 1, [6], "y", None, entries)
    assert not share.waits(0, first) and share.echo(0, held) == entries and list(held) == [early]
    assert not share.waits(1, held.popleft()) and share.echo(1, held) == entries and share.echo(1, held) is None
