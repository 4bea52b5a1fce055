"""`response_format` on both endpoints: json_object and json_schema answers from a model of random weights parse and
follow their schema, streamed and not, per choice; what cannot be compiled or served is a 400 naming the field."""
from __future__ import annotations

import json

import httpx
import pytest

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "rank": {"type": "integer", "minimum": 1, "maximum": 9},
                   "open": {"type": "boolean"}},
    "required": ["city", "rank", "open"],
    "additionalProperties": False,
}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "a city as JSON"}], "max_tokens": 120}


def _post(server, body: dict, path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def _follows(value: object) -> bool:
    return (isinstance(value, dict) and set(value) == {"city", "rank", "open"} and isinstance(value["city"], str)
            and len(value["city"]) <= 10 and type(value["rank"]) is int and 1 <= value["rank"] <= 9
            and isinstance(value["open"], bool))


def test_json_schema_answers_follow_the_schema_in_every_choice(server):
    r = _post(server, CHAT | {"response_format": AS_SCHEMA, "n": 3, "temperature": 1.0, "seed": 4})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert choice["finish_reason"] == "stop"
        assert _follows(json.loads(choice["message"]["content"])), choice["message"]["content"]


def test_json_object_streamed_joins_to_the_whole_answer(server):
    body = CHAT | {"response_format": {"type": "json_object"}, "temperature": 0}
    whole = _post(server, body).json()["choices"][0]["message"]["content"]
    assert isinstance(json.loads(whole), dict)
    with httpx.stream("POST", server.url + "/chat/completions", json=body | {"stream": True}, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == whole
    free = _post(server, CHAT | {"temperature": 0, "max_tokens": 20}).json()["choices"][0]["message"]["content"]
    with pytest.raises(ValueError):  # unguided, the same model writes no JSON
        json.loads(free)


def test_completions_take_a_schema_too(server):
    body = {"model": "tiny", "prompt": "Data:", "max_tokens": 120, "temperature": 0, "response_format": AS_SCHEMA}
    r = _post(server, body, "/completions")
    assert r.status_code == 200, r.text
    assert _follows(json.loads(r.json()["choices"][0]["text"]))


@pytest.mark.parametrize("fmt,message", [
    ({"type": "xml"}, "must be 'text', 'json_object' or 'json_schema'"),
    ("json", "must be an object"),
    ({"type": "json_schema"}, "json_schema' must be an object"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema' must be a JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "Invalid type: nonsense"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/defs/none"}}}, "Invalid JSON schema"),
])
def test_unusable_formats_are_a_400_naming_the_field(server, fmt, message):
    r = _post(server, CHAT | {"response_format": fmt})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    assert message in r.json()["error"]["message"]


def test_a_prefilled_answer_cannot_take_a_format(server):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{\"city\": "}]
    r = _post(server, CHAT | {"messages": messages, "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and "prefilled" in r.json()["error"]["message"]


def test_logit_bias_forces_a_token_on_both_endpoints(server):
    """A bias of 100 on one id makes it every greedy choice (its log-probabilities stay the model's own: low)."""
    for path, body in [("/chat/completions", CHAT), ("/completions", {"model": "tiny", "prompt": "Once"})]:
        base = body | {"temperature": 0, "max_tokens": 6}
        plain = _post(server, base, path).json()["choices"][0]
        r = _post(server, base | {"logit_bias": {"7": 100}, "logprobs": 1 if path == "/completions" else True}, path)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        tokens = choice["logprobs"]["tokens"] if path == "/completions" else [
            e["token"] for e in choice["logprobs"]["content"]]
        assert len(tokens) == 6 and len(set(tokens)) == 1, tokens
        assert choice.get("text", choice.get("message", {}).get("content")) != plain.get(
            "text", plain.get("message", {}).get("content"))
