"""The request fields a client sends, one by one: each is honoured as OpenAI documents it or refused with a 400 that
names it, never silently dropped."""
from __future__ import annotations

import httpx
import pytest

from engine.runtime import EngineConfig
from engine.tokenizer.chat_template import ChatTemplate
from server.protocol import ReasoningSplit, split_answer
from server.run import BackgroundServer
from tests.engine.test_reasoning_sweep import GRANITE_SHAPE
from tests.server.conftest import RecordingBridge

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0}


def post(server, body: dict, path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def answer(server, **fields) -> dict:
    r = post(server, CHAT | fields)
    assert r.status_code == 200, r.text
    return {"message": r.json()["choices"][0]["message"], "usage": r.json()["usage"]}


def test_text_parts_are_joined_one_per_line(server):
    """As vLLM and llama.cpp's server join them: ["Say", "hello."] is "Say\\nhello.", not "Sayhello."."""
    parts = [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello."}]
    joined = answer(server, messages=[{"role": "user", "content": "Say\nhello."}])
    assert answer(server, messages=[{"role": "user", "content": parts}]) == joined


def test_an_answer_that_refused_is_replayed_as_its_words(server):
    """OpenAI's assistant messages hold a refusal as a `refusal` part, or as `refusal` with no content."""
    said = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "I can't."},
            {"role": "user", "content": "Why?"}]
    want = answer(server, messages=said)
    for refused in ({"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
                    {"role": "assistant", "content": None, "refusal": "I can't."}):
        assert answer(server, messages=[said[0], refused, said[2]]) == want


def test_an_image_part_is_refused_by_its_type(server):
    r = post(server, CHAT | {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content", r.text
    assert "'image_url'" in r.json()["error"]["message"] and "only text" in r.json()["error"]["message"]


@pytest.mark.parametrize("fields", [{"max_completion_tokens": 0}, {"max_completion_tokens": -3, "max_tokens": 5},
                                    {"max_completion_tokens": 10**9}])
def test_a_bad_max_completion_tokens_is_named_as_sent(server, fields):
    r = post(server, CHAT | fields)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens", r.text
    assert "'max_completion_tokens' must be between 1 and" in r.json()["error"]["message"]


@pytest.mark.parametrize("name, value", [
    ("tool_choice", "required"),
    ("tool_choice", {"type": "function", "function": {"name": "get_weather"}}),
    ("function_call", {"name": "get_weather"}),
])
def test_a_tool_call_the_client_requires_is_refused(server, name, value):
    """No tools here: a client that demands a call must not get plain text as if it had been honoured."""
    r = post(server, CHAT | {name: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text


@pytest.mark.parametrize("name, value", [("tool_choice", "none"), ("tool_choice", "auto"), ("function_call", "none")])
def test_a_tool_choice_that_allows_plain_text_is_served(server, name, value):
    assert answer(server, **{name: value}) == answer(server)


@pytest.mark.parametrize("stop", ["", [""], ["", ""]])
def test_empty_stop_strings_are_dropped_as_llama_cpp_drops_them(server, stop):
    assert answer(server, stop=stop) == answer(server)


def test_a_stop_string_too_long_names_stop(server):
    r = post(server, CHAT | {"stop": ["x" * 1001]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop" and "1000" in r.json()["error"]["message"]


def test_min_p_of_one_keeps_only_the_most_likely_token(server):
    """The range the server states is 0 to 1; at 1 only tokens as likely as the top one are kept: greedy."""
    assert answer(server, min_p=1, temperature=1.5, seed=3, max_tokens=12) == answer(server, max_tokens=12)


COMPLETION = {"model": "tiny", "prompt": "Once upon", "max_tokens": 4, "temperature": 0}


def test_a_completion_s_logprobs_of_zero_is_honoured_not_dropped(server):
    """OpenAI and vLLM read `logprobs: 0` on /v1/completions as "the sampled tokens' log-probabilities"."""
    r = post(server, COMPLETION | {"logprobs": 0}, "/completions")
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"]["token_logprobs"], r.text
    assert answer(server, logprobs=False) == answer(server)  # chat's boolean: false asks for none


def test_an_empty_suffix_asks_for_none(server):
    texts = [post(server, COMPLETION | extra, "/completions").json()["choices"][0]["text"]
             for extra in ({"suffix": ""}, {})]
    assert texts[0] == texts[1]


GRANITE = "<think>The user greets.</think>\n<response>Hello!\n</response>\n"


@pytest.mark.parametrize("text, want", [
    (GRANITE, {"content": "Hello!", "reasoning_content": "The user greets."}),
    ("<think>T</think><response>Hi", {"content": "Hi", "reasoning_content": "T"}),  # cut short by max_tokens
    ("<think>T</think><response>a</response>b</response>", {"content": "a</response>b", "reasoning_content": "T"}),
    ("<think>T</think><response>Hi</response> more", {"content": "Hi</response> more", "reasoning_content": "T"}),
    ("<response>x</response>", {"content": "<response>x</response>"}),  # no thought: not Granite's wrapper
])
def test_granite_s_response_tags_are_not_in_the_content(text, want):
    """Granite 3.2+ answers `<think>…</think>` then `<response>…</response>`: the reply is what the response holds
    (as the app shows it and llama.cpp's server sends it), streamed in any pieces or whole."""
    assert split_answer(text) == want
    for size in (1, 2, 5):
        split = ReasoningSplit()
        deltas = [split.feed(text[i:i + size]) for i in range(0, len(text), size)] + [split.finish()]
        assert "".join(d.get("content", "") for d in deltas) == want["content"]


@pytest.fixture(scope="module")
def granite_server(tiny_models):
    bridge = RecordingBridge(EngineConfig(max_sessions=2, max_session_tokens=256, step_tokens=64, chunk_tokens=32))
    served = bridge.start().load(tiny_models["qwen3"].gguf_path, alias="tiny")
    bridge.engine._hosts[served.model_id].runtime.lm.tokenizer.chat_template = ChatTemplate(GRANITE_SHAPE)
    with BackgroundServer(bridge) as s:
        yield s
    bridge.shutdown()


def test_granite_s_thinking_kwarg_is_the_thinking_switch(granite_server):
    """vLLM's Granite docs send `chat_template_kwargs: {"thinking": true}`: the same switch as `enable_thinking`."""
    def prompt_tokens(kwargs: dict) -> int:
        return answer(granite_server, chat_template_kwargs=kwargs, max_tokens=1)["usage"]["prompt_tokens"]

    asked = prompt_tokens({"enable_thinking": True})
    assert prompt_tokens({"thinking": True}) == prompt_tokens({"thinking": True, "enable_thinking": True}) == asked
    assert prompt_tokens({"thinking": False}) == prompt_tokens({}) < asked  # the template's "Think first." left out
    r = post(granite_server, CHAT | {"chat_template_kwargs": {"thinking": True, "enable_thinking": False}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text


def test_reasoning_effort_is_the_thinking_switch(granite_server):
    """OpenAI's `reasoning_effort` (gpt-oss clients send it) sets thinking: high on, below medium off, medium the
    template's default; it was silently dropped."""
    def prompt_tokens(**fields) -> int:
        return answer(granite_server, max_tokens=1, **fields)["usage"]["prompt_tokens"]

    on, off = (prompt_tokens(chat_template_kwargs={"enable_thinking": flag}) for flag in (True, False))
    assert on > off
    assert prompt_tokens(reasoning_effort="high") == on and prompt_tokens(reasoning_effort="low") == off
    assert prompt_tokens(reasoning_effort="medium") == prompt_tokens()
    conflict = {"reasoning_effort": "high", "chat_template_kwargs": {"thinking": False}}
    for fields in ({"reasoning_effort": "max"}, conflict):
        r = post(granite_server, CHAT | fields)
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text


@pytest.mark.parametrize("name, digits", [("temperature", 400), ("max_tokens", 400), ("seed", 400), ("top_k", 5000)])
def test_a_number_too_long_for_a_float_or_for_python_is_a_400(server, name, digits):
    """A 400-digit integer raised OverflowError in the float check, a 5,000-digit one ValueError in the JSON reader
    (Python's 4,300-digit limit): both answered 500 'Internal server error'."""
    body = ('{"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "%s": 1%s}' % (name, "0" * digits))
    r = httpx.post(server.url + "/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    said = r.json()["error"]["message"]
    assert said == (f"'{name}' is out of range (an integer of {digits + 1} digits)." if digits < 4300 else
                    "The request body holds a number of more than 4,300 digits."), said
