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
