"""A day of use: long chats, many sessions; what must stay bounded (renders, slots, memory) as they grow."""
import random

import pytest

from engine import events as ev
from engine.loading.loader import LoadOptions, load_model
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from engine.session import TurnRequest, render_turn
from tests.support.engine_client import Client


class CountingTokenizer:
    """The real tokenizer, counting how often a turn renders the whole chat template."""

    def __init__(self, tok):
        self.tok, self.renders = tok, 0

    def apply_chat_template(self, *args, **kwargs):
        self.renders += 1
        return self.tok.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    return load_model(tiny_models["qwen3"].gguf_path, LoadOptions(device="cpu", dtype="float32")).tokenizer


def _long_chat(messages: int) -> TurnRequest:
    rnd = random.Random(0)
    words = "river lamp kettle window orange token cache memory".split()
    chat = tuple({"role": "user" if k % 2 == 0 else "assistant", "content": " ".join(rnd.choices(words, k=rnd.randint(5, 40)))}
                 for k in range(messages + 1))
    return TurnRequest(chat, SamplingParams(max_tokens=100), system_prompt="Be brief.")


def test_truncating_a_long_chat_renders_it_a_few_times_not_once_per_message(tokenizer):
    """Under `truncate` a turn of a 300-message chat leaves out the fewest old turns that bring it under half the
    context, as a scan from the oldest would, but renders the template O(log n) times: once per dropped message took
    minutes on a long chat."""
    request, limit = _long_chat(300), 1024
    expected = None
    for skip in range(1, len(request.messages)):  # the definition: the first user turn from which the rest fits
        if request.messages[skip]["role"] == "user":
            ids = tokenizer.apply_chat_template(request.conversation(skip))
            if len(ids) < limit // 2:
                expected = (ids, skip)
                break
    counting = CountingTokenizer(tokenizer)
    assert render_turn(request, False, "truncate", counting, limit) == expected
    assert expected[1] > 100 and counting.renders <= 10



def test_a_long_last_answer_stays_for_the_question_about_it(tokenizer):
    """Under `truncate`, a last answer over half the context: the cut that brings the chat under half left the new
    message alone ("shorten it" went without the answer it names; seen in a 600-message chat with 2,000-token code
    answers). Where the answer and the question fit with the answer's room, they stay, the older turns go."""
    rnd = random.Random(1)
    words = "river lamp kettle window orange token cache memory".split()
    long_answer = " ".join(rnd.choices(words, k=160))  # ~690 tokens of this tiny vocabulary
    chat = ({"role": "user", "content": "hello there"}, {"role": "assistant", "content": " ".join(rnd.choices(words, k=60))},
            {"role": "user", "content": "write a long story"}, {"role": "assistant", "content": long_answer},
            {"role": "user", "content": "shorten it"})
    request, limit = TurnRequest(chat, SamplingParams(max_tokens=100)), 1024
    assert len(tokenizer.apply_chat_template(request.conversation())) > limit - 100  # the whole leaves no room
    assert limit // 2 < len(tokenizer.apply_chat_template(request.conversation(2))) < limit - 100
    ids, dropped = render_turn(request, False, "truncate", tokenizer, limit)
    assert dropped == 2 and ids == tokenizer.apply_chat_template(request.conversation(2))  # before: 4, the question alone


def _past_the_context(tiny_models, max_tokens: int, turns: int) -> tuple[list, list]:
    """A `truncate` chat of `turns` short questions on a 256-token context: each turn's end and ContextUsage."""
    client = Client(EngineConfig(max_sessions=2, max_session_tokens=256, step_tokens=64, chunk_tokens=32))
    client.engine.start()
    try:
        model = client.load(tiny_models["qwen3"].gguf_path)
        sid = client.open(model, params=SamplingParams(max_tokens=max_tokens), overflow="truncate")
        ends = [client.ask(sid, f"question {k} about rivers and lamps") for k in range(turns)]
    finally:
        client.engine.shutdown()
    return ends, [e for e in client.all if isinstance(e, ev.ContextUsage)]


def test_a_chat_past_its_context_keeps_room_for_its_answers(tiny_models):
    """`truncate`, turn after turn past the context: dropping only what kept the prompt under the limit left answers
    cut by `context_full` a few tokens in; now the oldest turns make room for the answer's max_tokens."""
    ends, usage = _past_the_context(tiny_models, max_tokens=24, turns=24)
    assert usage[-1].dropped_messages > 0  # it passed its context
    assert [e.reason for e in ends if e.reason == "context_full"] == []
    assert all(e.stats.completion_tokens == 24 for e in ends if e.reason == "length")


def test_a_chat_past_its_context_keeps_its_cut_so_later_turns_reuse_the_cache(tiny_models):
    """`truncate`: a cut moved by every turn past the context made every such turn prefill its whole prompt again
    (915 of 915 tokens at 1024; 90 s a turn at 8k on a CPU). Cut under half the context and kept while the rest fits,
    most later turns prefill only their new message."""
    ends, usage = _past_the_context(tiny_models, max_tokens=12, turns=30)
    past = [k for k, u in enumerate(usage) if u.dropped_messages]
    assert len(past) > 10  # most turns ran past the context
    whole = [k for k in past if ends[k].stats.prefilled_tokens > ends[k].stats.prompt_tokens // 2]
    # a new cut now and then (at this 256-token context, every third turn), not every turn
    assert len(whole) <= len(past) // 2, (len(whole), len(past))
    assert all(u.used < u.limit for u in usage) and [e.reason for e in ends if e.reason == "context_full"] == []
