"""Bad requests get clear 4xx answers in OpenAI's error shape, and the server keeps serving."""
from __future__ import annotations

import httpx
import openai
import pytest

from server.app import _model
from server.bridge import ServedModel, ServerBridge
from server.protocol import APIError

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}


def post(server, path: str, body=None, content: bytes | None = None) -> httpx.Response:
    if content is not None:
        return httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, timeout=30)
    return httpx.post(server.url + path, json=body, timeout=30)


BAD = [
    ("malformed json", "/chat/completions", b'{"model": "tiny", "messages": [', 400, None, "not valid JSON"),
    ("json array", "/chat/completions", [1, 2], 400, None, "JSON object"),
    ("unknown model", "/chat/completions", CHAT | {"model": "gpt-9"}, 404, "model", "does not exist"),
    ("model not a string", "/chat/completions", CHAT | {"model": 5}, 400, "model", "id of a served model"),
    ("empty model", "/chat/completions", CHAT | {"model": ""}, 400, "model", "id of a served model"),
    ("absurd max_tokens", "/chat/completions", CHAT | {"max_tokens": 10**12}, 400, "max_tokens", "between 1 and"),
    ("zero max_tokens", "/chat/completions", CHAT | {"max_completion_tokens": 0}, 400, "max_completion_tokens",
     "between 1 and"),
    ("max_tokens string", "/chat/completions", CHAT | {"max_tokens": "ten"}, 400, "max_tokens", "integer"),
    ("temperature string", "/chat/completions", CHAT | {"temperature": "hot"}, 400, "temperature", "number"),
    ("temperature range", "/chat/completions", CHAT | {"temperature": 7}, 400, "temperature", "between"),
    ("top_p bool", "/chat/completions", CHAT | {"top_p": True}, 400, "top_p", "number"),
    ("stream not bool", "/chat/completions", CHAT | {"stream": "yes"}, 400, "stream", "boolean"),
    ("messages not list", "/chat/completions", CHAT | {"messages": "hello"}, 400, "messages", "non-empty array"),
    ("empty messages", "/chat/completions", CHAT | {"messages": []}, 400, "messages", "non-empty array"),
    ("bad role", "/chat/completions", CHAT | {"messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages[0].role", "role"),
    ("content number", "/chat/completions", CHAT | {"messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content", "string"),
    ("image part", "/chat/completions", CHAT | {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "messages[0].content", "text parts"),
    ("only a system message", "/chat/completions", CHAT | {"messages": [{"role": "system", "content": "x"}]}, 400,
     "messages", "one from the user"),
    ("empty answer only", "/chat/completions", CHAT | {"messages": [{"role": "assistant", "content": ""}]}, 400,
     "messages", "one from the user"),
    ("stop wrong type", "/chat/completions", CHAT | {"stop": [1, 2]}, 400, "stop", "stop"),
    ("n=0", "/chat/completions", CHAT | {"n": 0}, 400, "n", "between 1 and 128"),
    ("n=129", "/completions", {"model": "tiny", "prompt": "x", "n": 129}, 400, "n", "between 1 and 128"),
    ("n as text", "/chat/completions", CHAT | {"n": "2"}, 400, "n", "integer"),
    ("template kwargs not an object", "/chat/completions", CHAT | {"chat_template_kwargs": "x"}, 400,
     "chat_template_kwargs", "object"),
    ("unknown template kwarg", "/chat/completions", CHAT | {"chat_template_kwargs": {"tools_json": 1}}, 400,
     "chat_template_kwargs", "only 'enable_thinking'"),
    ("enable_thinking not bool", "/chat/completions", CHAT | {"chat_template_kwargs": {"enable_thinking": "no"}}, 400,
     "enable_thinking", "boolean"),
    ("tools to a model that shows none", "/chat/completions",
     CHAT | {"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", "cannot call tools"),
    ("logit_bias key", "/completions", {"model": "tiny", "prompt": "x", "logit_bias": {"a": 1}}, 400, "logit_bias",
     "token ids"),
    ("logit_bias value", "/chat/completions", CHAT | {"logit_bias": {"1": 101}}, 400, "logit_bias", "-100 to 100"),
    ("logit_bias past the vocabulary", "/chat/completions", CHAT | {"logit_bias": {"99999999": 1}}, 400, "logit_bias",
     "vocabulary has"),
    ("prompt over context", "/chat/completions", CHAT | {"messages": [{"role": "user", "content": "word " * 2000}]},
     400, "messages", "context"),
    ("completion prompt empty text", "/completions", {"model": "tiny", "prompt": ["x", ""]}, 400, "prompt[1]",
     "The prompt is empty"),
    ("completion prompt empty", "/completions", {"model": "tiny", "prompt": []}, 400, "prompt", "not an empty array"),
    ("completion prompt number", "/completions", {"model": "tiny", "prompt": 5}, 400, "prompt", "array of token ids"),
    ("completion ids empty", "/completions", {"model": "tiny", "prompt": [[1], []]}, 400, "prompt",
     "'prompt[1]' is an empty array of token ids"),
    ("completion id negative", "/completions", {"model": "tiny", "prompt": [1, -2]}, 400, "prompt", "-2, not a token id"),
    ("completion id boolean", "/completions", {"model": "tiny", "prompt": [[1, True]]}, 400, "prompt",
     "true, not a token id"),
    ("completion prompts mixed", "/completions", {"model": "tiny", "prompt": ["a", 1]}, 400, "prompt", "one kind"),
    ("completion id past the vocabulary", "/completions", {"model": "tiny", "prompt": [1, 99999999]}, 400, "prompt",
     "token id 99999999, outside this model's vocabulary"),
    ("second prompt past the vocabulary", "/completions", {"model": "tiny", "prompt": [[1], [99999999]]}, 400,
     "prompt[1]", "prompt[1]: The prompt holds token id 99999999"),
    ("completion ids with a suffix", "/completions", {"model": "tiny", "prompt": [1, 2], "suffix": "x"}, 400,
     "suffix", "needs a text prompt"),
    ("completion ids over context", "/completions", {"model": "tiny", "prompt": [1] * 300, "max_tokens": 4}, 400,
     "prompt", "The prompt needs 300 tokens"),
    ("second prompt over context", "/completions", {"model": "tiny", "prompt": ["x", "word " * 2000]}, 400,
     "prompt[1]", "context"),
    ("too many answers", "/completions", {"model": "tiny", "prompt": ["x"] * 17, "n": 128}, 400, "prompt",
     "at most 2,048 answers"),
    ("completion over context", "/completions", {"model": "tiny", "prompt": "word " * 2000, "max_tokens": 4}, 400,
     "prompt", "context"),
]


@pytest.mark.parametrize("path, body, status, param, words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_request_gets_a_clear_4xx_and_the_server_keeps_serving(server, bridge, path, body, status, param, words):
    r = post(server, path, content=body) if isinstance(body, bytes) else post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and words in err["message"], err
    ok = post(server, "/chat/completions", CHAT)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None
    assert bridge.open_sessions() == 0


def test_over_context_has_the_openai_code(server):
    r = post(server, "/chat/completions", CHAT | {"messages": [{"role": "user", "content": "word " * 2000}]})
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert "Start a new chat" not in err["message"] and "Shorten" in err["message"], err  # advice an API client can act on
    r = post(server, "/completions", {"model": "tiny", "prompt": "word " * 2000, "max_tokens": 4})
    assert r.json()["error"]["code"] == "context_length_exceeded" and r.json()["error"]["message"].startswith("The prompt")


def test_a_request_without_model_gets_the_one_served(server, bridge):
    named = post(server, "/chat/completions", CHAT)
    bare = post(server, "/chat/completions", {k: v for k, v in CHAT.items() if k != "model"})
    assert bare.status_code == 200, bare.text
    assert bare.json()["model"] == bridge.models[0].id
    assert bare.json()["choices"][0]["message"] == named.json()["choices"][0]["message"]  # greedy: the same answer


def test_unknown_route_and_method_answer_json(server):
    r = httpx.get(server.url + "/nope", timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.url + "/chat/completions", timeout=10)
    assert r.status_code == 405 and "error" in r.json()


@pytest.mark.parametrize("path, body", [("/chat/completions/", CHAT), ("/completions/", {"prompt": "hi", "max_tokens": 4})])
def test_a_trailing_slash_is_served_not_redirected(server, path, body):
    """Starlette answered a 307 to the path without it: `curl -X POST` (no -L) printed nothing."""
    r = post(server, path, body)
    assert r.status_code == 200 and r.json()["choices"], (r.status_code, r.text)
    assert httpx.get(server.url.removesuffix("/v1") + "/health/", timeout=10).json()["status"] == "ok"


def test_openai_client_raises_its_own_errors(server):
    c = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=-5)


def test_a_request_without_model_must_name_one_when_several_are_served():
    bridge = ServerBridge()  # not started: only its list of models is read
    bridge.models += [ServedModel("gemma", 1, 512), ServedModel("qwen", 2, 512, aliases=("tiny",))]
    assert _model(bridge, "tiny").id == "qwen" and _model(bridge, "gemma").model_id == 1
    with pytest.raises(APIError, match="'model' is required: this server has gemma, qwen.") as err:
        _model(bridge, None)
    assert err.value.status == 400 and err.value.param == "model"


@pytest.mark.parametrize("refused", [False, True])
def test_a_turn_the_free_memory_cannot_hold_is_a_503_not_the_servers_fault(refused):
    """The KV cache could not grow into the memory that is free: a 500 told clients the server was broken; a 503 says
    to try again (shorter, or later), with the engine's one line and its code."""
    from engine import events as ev
    from engine.errors import CacheMemoryError
    from engine.sampling import SamplingParams
    from server.app import _turn_error
    from server.protocol import TurnRequest

    error = CacheMemoryError("The conversation needs ~176 MB more memory for its cache and 60 MB is free; ...")
    event = ev.Error(1, 2, str(error), error.code)
    reply = _turn_error(event, TurnRequest(SamplingParams(), stream=False, include_usage=False, raw=False), refused)
    assert (reply.status, reply.code, reply.kind) == (503, "insufficient_memory", "server_error")
