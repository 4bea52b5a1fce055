"""A reasoning model through the server: its thought in `reasoning_content` (as DeepSeek's API and llama.cpp's server
send it), its reply in `content`, streamed or not, read by the official openai client."""
from __future__ import annotations

import openai
import pytest

from engine import events as ev
from engine.runtime import EngineConfig
from engine.tokenizer.chat_template import ChatTemplate
from server.protocol import ReasoningSplit, split_answer
from server.run import BackgroundServer
from tests.engine.test_reasoning_sweep import R1_SHAPE
from tests.server.conftest import RecordingBridge

ANSWER = "<think>\nThe user asks why.\n</think>\n\nBecause."


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_a_thought_streams_as_reasoning_content_however_the_text_arrives(size):
    split = ReasoningSplit()
    deltas = [split.feed(ANSWER[i:i + size]) for i in range(0, len(ANSWER), size)] + [split.finish()]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user asks why.\n"
    assert "".join(d.get("content", "") for d in deltas) == "Because."
    assert split_answer(ANSWER) == {"content": "Because.", "reasoning_content": "The user asks why.\n"}


@pytest.mark.parametrize("text, prefix, want", [
    ("<think>\n\n</think>\n\nOff.", "", {"content": "Off."}),  # thinking off: an empty thought is none
    ("Plain <think> in prose", "", {"content": "Plain <think> in prose"}),
    ("[THINK]x[/THINK]y", "", {"content": "y", "reasoning_content": "x"}),  # Magistral
    ("<think>\nCut while thi", "", {"content": "", "reasoning_content": "Cut while thi"}),
    (" more.\n</think>\n\nSo.", "<think>\nPlan", {"content": "So.", "reasoning_content": " more.\n"}),  # continued
    (" more", "<think>\nPlan</think>\n\nSo", {"content": " more"}),
])
def test_the_split_of_whole_answers(text, prefix, want):
    assert split_answer(text, prefix) == want


@pytest.fixture(scope="module")
def r1_server(tiny_models):
    bridge = RecordingBridge(EngineConfig(max_sessions=4, max_session_tokens=256, step_tokens=64, chunk_tokens=32))
    bridge.start()
    served = bridge.load(tiny_models["qwen3"].gguf_path, alias="tiny")
    bridge.engine._hosts[served.model_id].runtime.lm.tokenizer.chat_template = ChatTemplate(R1_SHAPE)
    with BackgroundServer(bridge) as s:
        yield s, bridge
    bridge.shutdown()


def test_the_thought_a_prompt_opened_is_reasoning_content_streamed_or_not(r1_server):
    server, bridge = r1_server
    c = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    ask = dict(model="tiny", messages=[{"role": "user", "content": "Why?"}], temperature=0, max_tokens=8)
    r = c.chat.completions.create(**ask)
    engine_text = [e for e in bridge.seen if isinstance(e, ev.Finished)][-1].text
    assert engine_text.startswith("<think>\n")  # still thinking when max_tokens cut it
    message = r.choices[0].message
    assert message.content == "" and message.reasoning_content == engine_text.removeprefix("<think>\n").lstrip()
    thought, reply = [], []
    for chunk in c.chat.completions.create(stream=True, **ask):
        for choice in chunk.choices:
            thought.append(getattr(choice.delta, "reasoning_content", None) or "")
            reply.append(choice.delta.content or "")
    assert "".join(thought) == message.reasoning_content and "".join(reply) == ""


@pytest.mark.parametrize("prefix, thinking", [("<think>\nPlan.\n</think>\n\nSo", False), ("<think>\nPlan", True)])
def test_a_continued_answer_comes_back_where_its_prefix_left_it(r1_server, prefix, thinking):
    """A prefill inside its thought goes on as reasoning_content; one past it, as content."""
    server, _ = r1_server
    c = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    r = c.chat.completions.create(model="tiny", temperature=0, max_tokens=6, messages=[
        {"role": "user", "content": "Why?"}, {"role": "assistant", "content": prefix}])
    message = r.choices[0].message
    thought = getattr(message, "reasoning_content", None)
    assert (bool(thought), bool(message.content)) == (thinking, not thinking)


def test_a_remote_models_reasoning_content_comes_back_as_its_thought(r1_server):
    """A remote endpoint that sends the thought apart (Parley's server, llama.cpp's, DeepSeek's API, vLLM's reasoning
    parsers): the answer holds it as a local model's, `<think>` first, not dropped."""
    from engine.sampling import SamplingParams
    from tests.support.engine_client import Client

    server, bridge = r1_server
    upstream = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Why?"}], temperature=0, max_tokens=8).choices[0].message
    c = Client(EngineConfig(max_sessions=2, max_session_tokens=256))
    c.engine.start()
    try:
        mid = c.engine.add_remote_model(server.url, bridge.models[0].id, None, 30)
        assert isinstance(c.wait_for(lambda e: isinstance(e, (ev.ModelLoaded, ev.ModelFailed)) and e.model_id == mid),
                          ev.ModelLoaded)
        answer = c.ask(c.open(mid, params=SamplingParams(temperature=0, max_tokens=8)), "Why?")
    finally:
        c.engine.shutdown()
    assert answer.text == "<think>" + upstream.reasoning_content


@pytest.mark.parametrize("deltas, text", [
    ([("a", ""), ("b", ""), ("", "R"), ("", "S")], "<think>ab</think>RS"),
    ([("", "R"), ("late", "")], "R"),  # thinking after the reply began is not shown
    ([("a", "R")], "<think>a</think>R"),
])
def test_thought_deltas_become_tags(deltas, text):
    from engine.remote import _ThoughtTags

    tags = _ThoughtTags()
    assert "".join(tags.wrap(t, c) for t, c in deltas) == text
