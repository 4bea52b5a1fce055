"""More chats than cache slots: turns wait in the order they were sent, one that waited says when it starts and
starts from the prefix a slot holds."""
import threading

import pytest

import engine.local_host as local_host
from engine import events as ev
from engine.runtime import EngineConfig
from engine.sampling import SamplerState, SamplingParams
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence, Status
from tests.support.engine_client import Client

LONG = SamplingParams(max_tokens=400)  # holds the only slot while the others queue (the context ends it at 256)
SHORT = SamplingParams(max_tokens=4)
SHORT_HOLD = SamplingParams(max_tokens=40)  # ends well before LONG: its slot goes to the waiting turn


@pytest.fixture
def gated(tiny_models, monkeypatch):
    """A client with one slot whose prompts marked "slow:" finish rendering only once `gate` is set: a prompt that
    takes longer to render (a pasted book) than one sent after it."""
    gate = threading.Event()
    render = local_host.render_turn

    def render_turn(request, *args):
        if request.messages[-1]["content"].startswith("slow:"):
            assert gate.wait(30)
        return render(request, *args)

    monkeypatch.setattr(local_host, "render_turn", render_turn)
    c = Client(EngineConfig(max_sessions=1, max_session_tokens=256, step_tokens=32, chunk_tokens=16, speculative="off"))
    c.engine.start()
    c.model = c.load(tiny_models["qwen3"].gguf_path)
    c.gate = gate
    yield c
    gate.set()
    c.engine.shutdown()


def _first_token_order(client: Client, turns: list[int]) -> list[int]:
    order = []
    for e in client.all:
        if isinstance(e, ev.TokenDelta) and e.turn_id in turns and e.turn_id not in order:
            order.append(e.turn_id)
    return order


def test_a_turn_sent_first_is_served_first_though_its_prompt_rendered_last(gated):
    """Prompts render on two threads: the turn whose prompt got ready first went first, whoever was sent first."""
    c = gated
    alone = {}
    for text in ("slow: first in line", "second in line"):
        sid = c.open(c.model, params=SHORT)
        c.gate.set()
        alone[text] = c.tokens(c.ask(sid, text).turn_id)
        c.close(sid)
    c.gate.clear()
    holder, first, second = (c.open(c.model, params=p) for p in (LONG, SHORT, SHORT))
    hold = c.send(holder, "hold the slot")
    c.wait_for(lambda e: isinstance(e, ev.TokenDelta) and e.turn_id == hold)
    a = c.send(first, "slow: first in line")
    b = c.send(second, "second in line")
    c.wait_for(lambda e: isinstance(e, ev.Queued) and e.turn_id == b)
    c.gate.set()
    for t in (hold, a, b):
        assert isinstance(c.wait(t), ev.Finished)
    assert any(isinstance(e, ev.Queued) for e in c.by_turn[a]), "the slow turn never waited: the test proves nothing"
    assert _first_token_order(c, [a, b]) == [a, b]
    assert c.tokens(a) == alone["slow: first in line"] and c.tokens(b) == alone["second in line"]


def test_a_queued_turn_is_started_again_when_it_gets_its_slot(gated):
    """The app shows a queued chat as waiting until it hears otherwise: it heard nothing until the first token, so a
    long prompt being read showed "queued" all along."""
    c = gated
    c.gate.set()
    holder, waiter = c.open(c.model, params=LONG), c.open(c.model, params=SHORT)
    hold = c.send(holder, "hold the slot")
    c.wait_for(lambda e: isinstance(e, ev.TokenDelta) and e.turn_id == hold)
    turn = c.send(waiter, "wait for it")
    assert isinstance(c.wait(turn), ev.Finished)
    kinds = [type(e).__name__ for e in c.by_turn[turn]]
    queued = max(i for i, k in enumerate(kinds) if k == "Queued")
    first_token = kinds.index("TokenDelta")
    assert queued < first_token and "Started" in kinds[queued:first_token], kinds
    assert kinds.count("Started") == 2, kinds


@pytest.fixture
def two_slots(tiny_models):
    c = Client(EngineConfig(max_sessions=2, max_session_tokens=512, step_tokens=32, chunk_tokens=16, speculative="off"))
    c.engine.start()
    c.model = c.load(tiny_models["qwen3"].gguf_path)
    yield c
    c.engine.shutdown()


def test_a_queued_turn_copies_the_prefix_a_slot_holds(two_slots):
    """A turn that found a slot free copied the system prompt another chat had cached; one that waited for its slot
    got an empty one and computed the whole prompt again."""
    c = two_slots
    system = "You answer in the house style: short sentences, plain words, one idea at a time. " * 6
    sid = c.open(c.model, params=SHORT, system=system)
    alone = c.ask(sid, "and now?")
    c.close(sid)
    c.engine.call(lambda engine: engine._hosts[c.model].runtime.prefixes.clear())  # nothing parked: a live slot's prefix
    first, second, waiter = (c.open(c.model, params=p, system=system) for p in (SHORT_HOLD, LONG, SHORT))
    turns = [c.send(first, "go on"), c.send(second, "keep going")]
    for t in turns:
        c.wait_for(lambda e, t=t: isinstance(e, ev.TokenDelta) and e.turn_id == t)
    turn = c.send(waiter, "and now?")
    end = c.wait(turn)
    assert any(isinstance(e, ev.Queued) for e in c.by_turn[turn]), "it never waited: the test proves nothing"
    assert end.stats.prefilled_tokens < end.stats.prompt_tokens // 4, end.stats
    assert c.tokens(turn) == c.tokens(alone.turn_id)


def test_the_queue_keeps_no_stamp_of_a_turn_stopped_before_it_was_queued():
    """A compare column waiting for another's prefill is stopped without passing the queue: its sequence (the whole
    conversation's tokens) stayed referenced by the scheduler after its chat was closed."""
    sched = Scheduler(SchedulerConfig(), cache=None)
    held, other = (Sequence(i, [1, 2, 3], SamplerState(SHORT)) for i in range(2))
    sched.stamp(held, 1.0)
    held.status = Status.FINISHED  # what ModelRuntime.stop does to a follower
    sched.stamp(other, 2.0)
    assert held not in sched._arrived


def test_a_groups_turns_wait_in_turn_with_other_clients_turns():
    """A server request's answers are one group: its later members queue behind other groups' earlier ones (a request
    of 256 prompts took every slot until its last answer began: a chat sent after it waited 23 s), while turns of no
    group keep the order they were sent in, also when added out of that order."""
    sched = Scheduler(SchedulerConfig(), cache=None)

    def seq(i: int, sent: float, group: int | None = None) -> Sequence:
        s = Sequence(i, [1, 2, 3], SamplerState(SHORT))
        s.group = group
        sched.stamp(s, sent)
        return s

    many = [seq(i, 1.0 + i / 100, group=7) for i in range(5)]
    chat, later, other = seq(10, 2.0), seq(11, 1.5), seq(12, 3.0, group=8)
    for s in (*many, chat, other, later):  # `later` was sent before `chat` but rendered after it
        sched.add(s)
    assert [s.seq_id for s in sched.waiting] == [0, 11, 10, 12, 1, 2, 3, 4]
    sched.finish(many[0], "stop")
    assert 7 in sched._groups and many[0] not in sched._groups[7]
    for s in (*many[1:], other):
        sched.finish(s, "stop")
    assert not sched._groups and not sched._rank
