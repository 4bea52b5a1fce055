"""Hostile values and prompts on the engine thread (issue 23): each fails its own turn, fast, and nobody else's."""
from __future__ import annotations

import time
import tracemalloc

import pytest

from app.core.chat_settings import ChatSettings
from engine import events as ev
from engine.errors import ParleyError
from engine.runtime import EngineConfig
from engine.sampling import SamplerState, SamplingParams, sample_ids
from tests.support.engine_client import Client

CONFIG = EngineConfig(max_sessions=4, max_session_tokens=256, step_tokens=32, chunk_tokens=16)


@pytest.fixture(scope="module")
def client(tiny_models):
    c = Client(CONFIG)
    c.engine.start()
    c.model = c.load(tiny_models["qwen3"].gguf_path)
    yield c
    c.engine.shutdown()


# -- item 3: sampling values are checked where they enter
@pytest.mark.parametrize("field, value", [
    ("top_k", 10**20), ("top_k", 2**40), ("seed", 2**70), ("seed", -1), ("temperature", float("nan")),
    ("temperature", float("inf")), ("top_p", float("nan")), ("max_tokens", 10**20), ("top_k", 2.5),
    ("top_k", True), ("repetition_penalty", float("inf")), ("presence_penalty", float("nan")), ("stop", ["x"] * 17),
])
def test_out_of_range_sampling_values_are_refused(field, value):
    with pytest.raises(ParleyError, match=field):
        SamplingParams(**{field: value})


def test_imported_chat_settings_with_a_huge_top_k_are_refused():
    with pytest.raises(ParleyError, match="top_k"):
        ChatSettings.from_dict({"top_k": 10**20})


def test_top_k_past_the_vocabulary_samples_like_no_top_k():
    import torch

    logits = torch.randn(2, 50)
    states = [SamplerState(SamplingParams(temperature=1.0, top_k=2**31 - 1, seed=3)),
              SamplerState(SamplingParams(temperature=1.0, top_k=0, seed=3))]
    ids = sample_ids(logits, states, [[], []])
    assert ids.shape == (2,) and all(0 <= int(i) < 50 for i in ids)


# -- item 2: prompts render off the engine thread, and text that cannot fit is refused before tokenising
def _max_gap(client: Client, turn_id: int) -> float:
    times = [t for t, e in client.stamped if getattr(e, "turn_id", None) == turn_id and isinstance(e, ev.TokenDelta)]
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


@pytest.fixture
def stamped(client):
    """Records when each event arrived."""
    client.stamped = []
    real = client.engine._sink

    def sink(e):
        client.stamped.append((time.monotonic(), e))
        real(e)

    client.engine._sink = sink
    yield client
    client.engine._sink = real


def test_a_slow_prompt_does_not_stall_another_chats_stream(stamped, client):
    tok = client.engine.loaded_model(client.model).tokenizer
    real = tok.apply_chat_template

    def slow(messages, *args, **kwargs):
        if "SLOW" in messages[-1]["content"]:
            time.sleep(2.0)  # a template or tokenizer busy with a huge or hostile prompt
        return real(messages, *args, **kwargs)

    model = client.engine.loaded_model(client.model).model
    real_forward = model.forward

    def paced(*args, **kwargs):
        time.sleep(0.01)
        return real_forward(*args, **kwargs)

    tok.apply_chat_template, model.forward = slow, paced
    try:
        a = client.open(client.model, params=SamplingParams(max_tokens=150, stop=["never \u2603"]))
        b = client.open(client.model, params=SamplingParams(max_tokens=4))
        turn_a = client.send(a, "stream on")
        client.wait_for(lambda e: isinstance(e, ev.TokenDelta) and e.turn_id == turn_a)
        turn_b = client.send(b, "SLOW prompt")
        assert isinstance(client.wait(turn_b), ev.Finished)
        assert isinstance(client.wait(turn_a), ev.Finished)
    finally:
        tok.apply_chat_template, model.forward = real, real_forward
    assert _max_gap(client, turn_a) < 1.0, _max_gap(client, turn_a)


def test_a_slow_model_load_does_not_stall_another_chats_stream(stamped, client, tiny_models, monkeypatch):
    """Item 5: a model is read on the loader thread; a chat streaming meanwhile keeps its pace."""
    import engine.engine as engine_module

    real_load = engine_module.load_model

    def slow_load(*args, **kwargs):
        time.sleep(2.0)  # a big file being read, or a hostile one being checked
        return real_load(*args, **kwargs)

    model = client.engine.loaded_model(client.model).model
    real_forward = model.forward

    def paced(*args, **kwargs):
        time.sleep(0.01)
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(engine_module, "load_model", slow_load)
    model.forward = paced
    try:
        a = client.open(client.model, params=SamplingParams(max_tokens=150, stop=["never \u2603"]))
        turn_a = client.send(a, "stream on")
        client.wait_for(lambda e: isinstance(e, ev.TokenDelta) and e.turn_id == turn_a)
        other = client.load(tiny_models["llama"].gguf_path)
        assert isinstance(client.wait(turn_a), ev.Finished)
    finally:
        model.forward = real_forward
    assert other is not None and _max_gap(client, turn_a) < 1.0, _max_gap(client, turn_a)


def test_a_cancel_while_the_prompt_renders_ends_the_turn(client):
    tok = client.engine.loaded_model(client.model).tokenizer
    real = tok.apply_chat_template

    def slow(messages, *args, **kwargs):
        time.sleep(1.0)
        return real(messages, *args, **kwargs)

    tok.apply_chat_template = slow
    try:
        sid = client.open(client.model, params=SamplingParams(max_tokens=4))
        turn = client.send(sid, "hello")
        time.sleep(0.2)
        client.engine.cancel(sid)
        end = client.wait(turn, timeout=10)
        time.sleep(1.2)  # the render finishes: its result must be dropped
    finally:
        tok.apply_chat_template = real
    assert isinstance(end, ev.Finished) and end.reason == "cancelled"
    assert not any(isinstance(e, ev.Started) for e in client.by_turn[turn])
    assert client.ask(sid, "again").reason in ("stop", "length")


@pytest.mark.parametrize("overflow", ["stop", "truncate"])
def test_a_message_far_over_the_context_is_refused_at_once(client, overflow):
    sid = client.open(client.model, params=SamplingParams(max_tokens=4), overflow=overflow)
    text = "word " * 4_000_000  # 20 MB: tokenising it takes tens of seconds and gigabytes
    tracemalloc.start()
    start = time.monotonic()
    end = client.wait(client.send(sid, text), timeout=60)
    took = time.monotonic() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert isinstance(end, ev.Error) and "context" in end.message, end
    assert took < 2.0 and peak < 100 << 20, (took, peak)


# -- item 15: after shutdown every call still gets an answer
def test_after_shutdown_submit_errors_and_call_raises(tiny_models):
    c = Client(CONFIG)
    c.engine.start()
    model = c.load(tiny_models["qwen3"].gguf_path)
    sid = c.open(model)
    c.engine.shutdown()
    turn = c.send(sid, "hello?")
    end = c.wait(turn, timeout=5)
    assert isinstance(end, ev.Error) and "shut down" in end.message
    start = time.monotonic()
    with pytest.raises(ParleyError, match="shut down"):
        c.engine.call(lambda engine: 1, timeout=30)
    assert time.monotonic() - start < 1.0


def test_call_hands_back_the_functions_exception(client):
    def boom(engine):
        raise KeyError("the function's own error")

    start = time.monotonic()
    with pytest.raises(KeyError, match="own error"):
        client.engine.call(boom, timeout=30)
    assert time.monotonic() - start < 5.0
    assert client.engine.call(lambda engine: 7) == 7
