"""The prefix cache through the engine's sessions: a turn finds its prefix wherever a slot of its model holds it."""
import pytest

from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.support.engine_client import Client

GREEDY = SamplingParams(max_tokens=8)
SYSTEM = "You are a careful assistant who answers in full sentences. " * 3


@pytest.fixture(params=["sequence", "cell"])
def client(tiny_models, request):
    c = Client(EngineConfig(kv_layout=request.param, max_sessions=2, max_session_tokens=256, step_tokens=32,
                            chunk_tokens=16, speculative="off"))
    c.engine.start()
    c.model = c.load(tiny_models["llama"].gguf_path)
    yield c
    c.engine.shutdown()


def test_an_idle_chats_prefix_seeds_a_new_chat_when_every_slot_is_held(client):
    """Every slot held by an idle chat: a new chat with the first one's system prompt copies it (another idle chat
    gives up its slot, as it would to let the turn in) instead of prefilling it all again."""
    first = client.open(client.model, GREEDY, SYSTEM)
    a = client.ask(first, "hello")
    client.ask(client.open(client.model, GREEDY, "Be brief."), "something else")
    assert client.free_slots(client.model) == 0
    b = client.ask(client.open(client.model, GREEDY, SYSTEM), "hello")
    assert b.stats.prefilled_tokens <= 1 and client.tokens(b.turn_id) == client.tokens(a.turn_id)
    assert client.ask(first, "and then?").stats.prefilled_tokens < a.stats.prompt_tokens  # the source kept its cache


def test_compare_columns_share_their_prompt_when_idle_chats_hold_the_slots(client):
    """The same prompt sent to two columns while an idle chat holds a slot: the second column still copies the
    first one's prefill (it prefilled it all again when no slot was free at the copy)."""
    client.ask(client.open(client.model, GREEDY, "Be brief."), "an earlier chat")
    columns = [client.open(client.model, GREEDY, SYSTEM) for _ in range(2)]
    turns = [client.send(sid, "the same question") for sid in columns]
    ends = [client.wait(t) for t in turns]
    assert sorted(e.stats.prefilled_tokens for e in ends)[0] <= 1
    assert client.tokens(turns[0]) == client.tokens(turns[1])
