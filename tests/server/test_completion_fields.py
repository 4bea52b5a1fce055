"""/v1/completions' `echo` (the prompt before each text, streamed first), `best_of` (that many answers made, the
`n` with the highest mean log-probability a token sent, best first; every one counted in usage) and `suffix` (a code
model's fill-in-the-middle document, as a client that writes the markers itself gets it)."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from server.bridge import ServerBridge
from server.run import BackgroundServer
from tests.support.gguf_export import write_gguf
from tests.support.tiny_models import make_tiny_hf

FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")

BODY = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 11}


def _post(server, body: dict, path: str = "/completions") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def _mean(choice: dict) -> float:
    lps = choice["logprobs"]["token_logprobs"]
    return sum(lps) / len(lps)


def test_echo_puts_the_prompt_before_each_text(server):
    plain = _post(server, BODY | {"n": 2}).json()["choices"]
    echoed = _post(server, BODY | {"n": 2, "echo": True}).json()["choices"]
    assert [c["text"] for c in echoed] == [BODY["prompt"] + c["text"] for c in plain]


def test_echo_streams_the_prompt_first(server):
    whole = _post(server, BODY | {"echo": True}).json()["choices"][0]["text"]
    with httpx.stream("POST", server.url + "/completions", json=BODY | {"echo": True, "stream": True}, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts[0] == BODY["prompt"] and "".join(texts) == whole


def test_best_of_sends_the_answers_with_the_highest_mean_log_probability(server):
    """best_of 5 makes the answers of seeds 11..15 (as n=5 does); the two sent are the two best of them by mean
    log-probability a token, best first; usage counts all five."""
    five = _post(server, BODY | {"n": 5, "logprobs": 0}).json()
    ranked = sorted(five["choices"], key=_mean, reverse=True)
    best = _post(server, BODY | {"n": 2, "best_of": 5, "logprobs": 0}).json()
    assert [c["text"] for c in best["choices"]] == [c["text"] for c in ranked[:2]]
    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert best["usage"] == five["usage"]
    without = _post(server, BODY | {"n": 2, "best_of": 5}).json()  # ranked all the same; no log-probabilities sent
    assert [c["text"] for c in without["choices"]] == [c["text"] for c in ranked[:2]]
    assert all(c["logprobs"] is None for c in without["choices"])


@pytest.mark.parametrize("fields,param,words", [
    ({"best_of": 1, "n": 2}, "best_of", "between 'n' (2)"),
    ({"best_of": 129}, "best_of", "and 128"),
    ({"best_of": 3, "stream": True}, "best_of", "cannot stream"),
])
def test_unusable_completion_fields_are_a_400_naming_them(server, fields, param, words):
    r = _post(server, BODY | fields)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert words in r.json()["error"]["message"]


@pytest.mark.parametrize("field,value", [("echo", True), ("best_of", 2), ("suffix", "end")])
def test_chat_takes_neither(server, field, value):
    r = _post(server, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], field: value},
              "/chat/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def fim_gguf(folder: Path) -> Path:
    """A tiny Qwen3 whose vocabulary holds Qwen2.5-Coder's three fill-in-the-middle tokens (ids 403-405)."""
    hf = make_tiny_hf("qwen3", folder / "hf", config={"vocab_size": 406})
    tokenizer = json.loads((hf / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["added_tokens"] += [{"id": 403 + i, "content": m, "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False, "special": True} for i, m in enumerate(FIM)]
    (hf / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return write_gguf(hf, folder / "fim.gguf")


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    bridge = ServerBridge().start()
    bridge.load(fim_gguf(tmp_path_factory.mktemp("fim")), alias="coder")
    try:
        with BackgroundServer(bridge) as server:
            yield server
    finally:
        bridge.shutdown()


def test_suffix_fills_the_middle_as_a_prompt_with_the_markers_does(fim_server):
    """The server writes the document a client writing the markers itself would send: the same tokens in (usage)
    and the same answer out; echo gives back the client's prompt, not the document."""
    body = {"model": "coder", "prompt": "def area(r):\n    return ", "max_tokens": 10, "temperature": 0}
    filled = _post(fim_server, body | {"suffix": "\n\nprint(area(2))"}).json()
    by_hand = _post(fim_server, body | {"prompt": f"{FIM[0]}{body['prompt']}{FIM[1]}\n\nprint(area(2)){FIM[2]}"}).json()
    assert filled["choices"][0]["text"] == by_hand["choices"][0]["text"]
    assert filled["usage"] == by_hand["usage"]
    plain = _post(fim_server, body).json()
    assert plain["usage"]["prompt_tokens"] < filled["usage"]["prompt_tokens"] - 3  # the markers and the suffix went in
    echoed = _post(fim_server, body | {"suffix": "x", "echo": True}).json()["choices"][0]["text"]
    assert echoed.startswith(body["prompt"]) and "<|fim" not in echoed


@pytest.mark.parametrize("stream", [False, True])
def test_a_suffix_with_a_scored_echo_is_a_400(fim_server, stream):
    """The prompt scored is the fill-in-the-middle document: its entries listed the markers and the suffix, with
    offsets past the echoed text (29 entries for 'def area(r):\n    return ' and 3 answer tokens). Refused, as
    neither OpenAI's echo nor its offsets can say where the suffix went; echo or logprobs alone still answer."""
    body = {"model": "coder", "prompt": "def area(r):\n    return ", "suffix": "\n\nprint(area(2))", "max_tokens": 3,
            "temperature": 0, "stream": stream}
    r = _post(fim_server, body | {"echo": True, "logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text
    assert "fill-in-the-middle" in r.json()["error"]["message"]
    assert _post(fim_server, body | {"echo": True}).status_code == 200
    assert _post(fim_server, body | {"logprobs": 1}).status_code == 200


def test_a_suffix_fills_each_of_several_prompts(fim_server):
    """The suffix goes after every prompt of an array: each filled as it would be alone, prompt by prompt."""
    body = {"model": "coder", "max_tokens": 10, "temperature": 0, "suffix": "\n\nprint(area(2))"}
    prompts = ["def area(r):\n    return ", "def side(a):\n    return "]
    alone = [_post(fim_server, body | {"prompt": p}).json()["choices"][0]["text"] for p in prompts]
    both = _post(fim_server, body | {"prompt": prompts}).json()["choices"]
    assert [c["text"] for c in both] == alone and [c["index"] for c in both] == [0, 1]


def test_a_model_without_fill_in_the_middle_tokens_refuses_a_suffix(server):
    r = _post(server, BODY | {"suffix": "The end."})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix", r.text
    assert "fill in the middle" in r.json()["error"]["message"]
    assert _post(server, BODY | {"suffix": ""}).status_code == 200  # an empty suffix asks for none


@pytest.mark.parametrize("seed", [6, 24])
def test_best_of_ranks_the_same_answers_with_a_scored_echo(server, seed):
    """A scored echo lists the end-of-turn token an answer ends with (as vLLM does): its entry counted in the mean, an
    answer of that token alone (seed 6: no entry without echo) or a short one (24) was sent in place of the best."""
    body = BODY | {"n": 1, "best_of": 4, "logprobs": 0, "seed": seed}
    plain = _post(server, body).json()["choices"][0]
    echoed = _post(server, body | {"echo": True}).json()["choices"][0]
    assert (echoed["text"], echoed["finish_reason"]) == (BODY["prompt"] + plain["text"], plain["finish_reason"])
