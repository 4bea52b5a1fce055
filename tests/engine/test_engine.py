"""The engine thread on a tiny model: sessions, turns, prefix reuse, fork/rewind, queueing, faults."""
import random
import threading

import pytest
import torch

from engine import events as ev
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.support.engine_client import Client

GREEDY = SamplingParams(max_tokens=12)


@pytest.fixture(params=[False, True], ids=["plain", "lookahead"])
def client(tiny_models, request):
    config = EngineConfig(max_sessions=4, max_session_tokens=256, step_tokens=32, chunk_tokens=16, lookahead=request.param)
    c = Client(config)
    c.lookahead = bool(request.param)
    c.engine.start()
    c.model = c.load(tiny_models["qwen3"].gguf_path)
    yield c
    c.engine.shutdown()


def test_turn_events_in_order_and_text_matches(client):
    sid = client.open(client.model, params=GREEDY)
    turn = client.send(sid, "Hello there")
    end = client.wait(turn)
    kinds = [type(e).__name__ for e in client.by_turn[turn]]
    assert kinds[0] == "Started" and kinds[-1] == "Finished" and set(kinds[1:-1]) == {"TokenDelta"}
    assert any(isinstance(e, ev.ContextUsage) and e.session_id == sid for e in client.all)
    assert client.text(turn) == end.text
    assert end.reason in ("stop", "length")
    s = end.stats
    assert s.completion_tokens == len(client.tokens(turn)) and s.prompt_tokens > 0 and s.ttft_s > 0


def test_batched_sessions_equal_alone(client):
    prompts = ["alpha beta", "def f(x): return x * 2", "1 2 3 4 5 6 7 8", "naïve café über", "The end."]
    alone = []
    for p in prompts:
        sid = client.open(client.model, params=GREEDY)
        alone.append(client.tokens(client.ask(sid, p).turn_id))
    sids = [client.open(client.model, params=GREEDY) for _ in prompts]
    turns = [client.send(sid, p) for sid, p in zip(sids, prompts)]  # 5 sessions, 4 slots: one queues
    for t in turns:
        assert isinstance(client.wait(t), ev.Finished)
    assert [client.tokens(t) for t in turns] == alone
    assert any(isinstance(e, ev.Queued) for e in client.all)
    ran_ahead = client.engine.inspect()["models"][client.model]["lookahead_steps"]
    assert (ran_ahead > 0) == client.lookahead


def test_seeded_sampling_is_reproducible_alone_or_batched(client):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=12)
    sid = client.open(client.model, params=params)
    alone = client.tokens(client.ask(sid, "tell me a story").turn_id)
    others = [client.open(client.model, params=SamplingParams(temperature=1.0, max_tokens=12)) for _ in range(2)]
    sid2 = client.open(client.model, params=params)
    turns = [client.send(o, "noise " * (i + 1)) for i, o in enumerate(others)]
    mine = client.send(sid2, "tell me a story")
    for t in turns + [mine]:
        client.wait(t)
    assert client.tokens(mine) == alone


def test_second_turn_prefills_only_new_tokens(client):
    sid = client.open(client.model, system="Be brief.", params=GREEDY)
    first = client.ask(sid, "first question")
    second = client.ask(sid, "second question")
    assert second.stats.prompt_tokens > first.stats.prompt_tokens
    assert second.stats.prefilled_tokens < second.stats.prompt_tokens - first.stats.prompt_tokens + 8


def test_regenerate_greedy_is_identical_and_cheap(client):
    sid = client.open(client.model, params=GREEDY)
    first = client.ask(sid, "question")
    again = client.wait(client.regenerate(sid))
    assert client.tokens(again.turn_id) == client.tokens(first.turn_id)
    assert again.stats.prefilled_tokens <= 1


def test_fork_and_rewind_equal_fresh_sessions(client):
    sid = client.open(client.model, params=GREEDY)
    client.ask(sid, "one")
    client.ask(sid, "two")
    child = client.fork(sid, at_message=2)  # keeps "one" and its answer
    branch = client.ask(child, "three")
    fresh = client.open(client.model, params=GREEDY)
    client.ask(fresh, "one")
    assert client.tokens(client.ask(fresh, "three").turn_id) == client.tokens(branch.turn_id)
    assert branch.stats.prefilled_tokens < branch.stats.prompt_tokens  # the fork shared the cache prefix
    client.rewind(sid, 2)
    edited = client.ask(sid, "three")
    assert client.tokens(edited.turn_id) == client.tokens(branch.turn_id)


def test_cancel_mid_stream(client):
    sid = client.open(client.model, params=SamplingParams(max_tokens=200))
    turn = client.send(sid, "go on and on")
    client.wait_for(lambda e: isinstance(e, ev.TokenDelta) and e.turn_id == turn)
    client.engine.cancel(sid)
    end = client.wait(turn)
    assert end.reason in ("cancelled", "length", "stop")
    follow = client.ask(sid, "and now?")  # the session keeps working
    assert follow.reason in ("stop", "length")


def test_stop_string_ends_the_turn_and_is_not_shown(client):
    sid = client.open(client.model, params=GREEDY)
    probe = client.ask(sid, "find a stop")
    if len(probe.text) < 4:
        pytest.skip("the tiny model answered with too little text to cut")
    stop = probe.text[2:4]
    sid2 = client.open(client.model, params=SamplingParams(max_tokens=12, stop=[stop]))
    end = client.ask(sid2, "find a stop")
    assert end.reason == "stop_string"
    assert end.text == probe.text[: probe.text.index(stop)]


def test_a_stop_string_completed_by_the_last_allowed_token_ends_as_a_stop_string(client):
    sid = client.open(client.model, params=GREEDY)
    probe = client.ask(sid, "find a stop")
    pieces = [e.text for e in client.by_turn[probe.turn_id] if isinstance(e, ev.TokenDelta)]
    at = next((k for k in range(1, len(pieces)) if pieces[k].strip() and pieces[k] not in "".join(pieces[:k])), None)
    if at is None:
        pytest.skip("the tiny model's answer has no piece to stop on")
    sid2 = client.open(client.model, params=SamplingParams(max_tokens=at + 1, stop=[pieces[at]]))
    end = client.ask(sid2, "find a stop")
    assert end.reason == "stop_string" and end.text == "".join(pieces[:at])


def test_context_overflow_policies(client):
    long = "word " * 400  # over the 256-token context
    sid = client.open(client.model, params=GREEDY)
    err = client.wait(client.send(sid, long))
    assert isinstance(err, ev.Error) and "context" in err.message and err.code == "context_length_exceeded"
    assert err.message.startswith("The message needs")  # the only message, no system prompt: nothing else to name
    assert "one more for the answer" in err.message  # a prompt of exactly the context read "needs 384, holds 384"
    assert client.ask(sid, "short").reason in ("stop", "length")  # the refused message was not kept
    err = client.wait(client.send(sid, long))
    assert "leave out the oldest turns" in err.message  # under `stop`, after a turn, dropping old turns would help
    cut = client.open(client.model, params=GREEDY, overflow="truncate")
    err = client.wait(client.send(cut, long))  # old turns are dropped already: only a shorter message helps
    assert isinstance(err, ev.Error) and err.message.startswith("The message needs") and "oldest" not in err.message
    assert err.code == "context_length_exceeded"


def test_unexpected_failure_starting_a_turn_ends_it(client):
    sid = client.open(client.model, params=GREEDY)
    tokenizer = client.engine.loaded_model(client.model).tokenizer
    real = tokenizer.apply_chat_template
    tokenizer.apply_chat_template = lambda *a, **k: 1 / 0
    try:
        err = client.wait(client.send(sid, "hi"))
    finally:
        tokenizer.apply_chat_template = real
    assert isinstance(err, ev.Error) and "ZeroDivisionError" in err.message
    assert client.ask(sid, "hi again").reason in ("stop", "length")
    assert client.chats[sid].messages[0]["content"] == "hi again"
    sid2 = client.open(client.model, params=GREEDY, overflow="truncate")
    for i in range(6):
        client.ask(sid2, f"message {i} " + "pad " * 30)
    usage = [e for e in client.all if isinstance(e, ev.ContextUsage) and e.session_id == sid2]
    assert usage[-1].dropped_messages > 0 and usage[-1].used < usage[-1].limit


def test_long_generation_stops_at_context_limit(client):
    sid = client.open(client.model, params=SamplingParams(max_tokens=10_000))
    end = client.ask(sid, "x")
    assert end.reason in ("context_full", "stop")
    if end.reason == "context_full":
        assert end.stats.context_used == end.stats.context_limit


def test_exception_in_a_step_fails_only_that_step(client):
    model = client.engine.loaded_model(client.model).model
    real_forward = model.forward
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real_forward(*args, **kwargs)

    sid = client.open(client.model, params=GREEDY)
    model.forward = flaky
    try:
        err = client.wait(client.send(sid, "boom"))
        assert isinstance(err, ev.Error) and "injected fault" in err.message
        ok = client.ask(sid, "again")  # the same session and the engine keep serving
        assert ok.reason in ("stop", "length")
    finally:
        model.forward = real_forward
    assert client.free_slots(client.model) >= 3


def test_a_step_the_allocator_refuses_ends_its_turn_in_one_line(client):
    """Under prlimit --as 1,500 MB a drafting answer of the embedded model failed mid-way with torch's own text
    ('Generation failed: RuntimeError("[enforce fail at alloc_cpu.cpp:127] ... you tried to allocate 13631488
    bytes ...")'): a tape's logits, memory the load had counted taken since. The turn ends in one plain line, the
    engine goes on. (The allocator's refusal is raised here in the forward, with the text it gave.)"""
    model = client.engine.loaded_model(client.model).model
    real_forward = model.forward

    def refused(*args, **kwargs):
        model.forward = real_forward
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 13631488 bytes. Error code 12 (Cannot allocate memory)")

    sid = client.open(client.model, params=GREEDY)
    model.forward = refused
    try:
        err = client.wait(client.send(sid, "boom"))
    finally:
        model.forward = real_forward
    assert isinstance(err, ev.Error) and err.message == ("Generation failed: the memory ran out during this answer; "
                                                         "free some memory, close other chats or choose a smaller "
                                                         "model."), err.message
    assert client.ask(sid, "again").reason in ("stop", "length")


def test_failed_model_load_reports_and_engine_stays_usable(client, corrupt_ggufs, tiny_models):
    bad = client.engine.load_model(corrupt_ggufs["truncated"])
    failed = client.wait_for(lambda e: isinstance(e, ev.ModelFailed) and e.model_id == bad)
    assert "truncated" in failed.message
    sid = client.engine.open_session(bad)
    err = client.wait_for(lambda e: isinstance(e, ev.Error) and e.session_id == sid)
    assert "not loaded" in err.message
    other = client.load(tiny_models["llama"].gguf_path)  # a second model beside the first
    s1 = client.open(client.model, params=GREEDY)
    s2 = client.open(other, params=GREEDY)
    t1, t2 = client.send(s1, "hi"), client.send(s2, "hi")
    assert isinstance(client.wait(t1), ev.Finished) and isinstance(client.wait(t2), ev.Finished)


def test_stress_many_threads(client):
    """Threads open, submit, cancel, fork and close while others generate; every turn ends exactly once."""
    rng = random.Random(0)
    turns, sessions, lock = [], [], threading.Lock()

    def worker(seed: int) -> None:
        r = random.Random(seed)
        mine = []
        for _ in range(30):
            op = r.random()
            eng = client.engine
            if op < 0.25 or not mine:
                mine.append(client.open(client.model, params=SamplingParams(max_tokens=r.randint(1, 8))))
            elif op < 0.6:
                t = client.send(r.choice(mine), f"q{r.randint(0, 99)}")
                with lock:
                    turns.append(t)
            elif op < 0.7:
                eng.cancel(r.choice(mine))
            elif op < 0.8:
                mine.append(client.fork(r.choice(mine)))
            elif op < 0.9:
                with lock:
                    turns.append(client.regenerate(r.choice(mine)))
            else:
                eng.close(mine.pop(r.randrange(len(mine))))
        with lock:
            sessions.extend(mine)

    threads = [threading.Thread(target=worker, args=(rng.random(),)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in turns:
        client.wait(t, timeout=300)  # Finished or Error, exactly once (the client asserts no second end)
    assert len(turns) > 50
    for sid in sessions:
        client.engine.close(sid)
    assert client.free_slots(client.model) == 4  # no leaked cache slot
    assert client.engine.inspect()["sessions"] == 0


def test_seeded_regenerate_draws_the_same_answer(client):
    """A seed in the params seeds every turn: regenerating with Seed = 7 gives the same answer again."""
    sid = client.open(client.model, params=SamplingParams(temperature=1.0, seed=7, max_tokens=12))
    first = client.ask(sid, "tell me a story")
    again = client.wait(client.regenerate(sid))
    assert client.tokens(again.turn_id) == client.tokens(first.turn_id)


def test_turn_carries_its_conversation_and_reuses_the_cached_prefix(client):
    """The caller owns the conversation: a turn on another branch equals a fresh session's, prefilling only what differs."""
    sid = client.open(client.model, params=GREEDY)
    client.ask(sid, "one")
    client.ask(sid, "two")
    branch = [dict(m) for m in client.chats[sid].messages[:2]] + [{"role": "user", "content": "three"}]
    turn = client.wait(client.engine.submit(sid, branch, GREEDY))
    fresh = client.open(client.model, params=GREEDY)
    client.ask(fresh, "one")
    expected = client.ask(fresh, "three")
    assert client.tokens(turn.turn_id) == client.tokens(expected.turn_id)
    assert turn.stats.prefilled_tokens < turn.stats.prompt_tokens // 2


@pytest.mark.parametrize("messages, continue_final, needle", [
    ([], False, "no message"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], False, "last message"),
    ([{"role": "user", "content": "hi"}], True, "no answer to continue"),
    ([{"role": "system", "content": "hi"}], False, "user, assistant or tool"),
])
def test_malformed_turns_fail_alone(client, messages, continue_final, needle):
    sid = client.open(client.model, params=GREEDY)
    err = client.wait(client.engine.submit(sid, messages, GREEDY, continue_final=continue_final))
    assert isinstance(err, ev.Error) and needle in err.message
    assert client.ask(sid, "fine").reason in ("stop", "length")


def test_an_overflow_names_the_system_prompt_only_where_there_is_one(client):
    """`parley generate` has no system prompt, yet its refusal read "The last message (with the system prompt)"."""
    long = "word " * 400
    sid = client.open(client.model, params=GREEDY)
    bare = client.wait(client.send(sid, long))
    assert bare.message.startswith("The message needs") and "system prompt" not in bare.message
    told = client.wait(client.engine.submit(sid, [{"role": "user", "content": long}], GREEDY, "Be brief."))
    assert told.message.startswith("The message (with the system prompt) needs")
