"""The engine thread end to end on each device here, from an HF folder (no GGUF: the GPU machines have no
`gguf`): sessions batched together equal each one alone. On CUDA this is the whole default path — CUDA
graphs, look-ahead, the fused kernels and, on Hopper, the PDL-chained Triton GEMMs. fp32, so the
comparison is exact up to reduction order, which greedy decoding of the tiny model does not feel."""

from __future__ import annotations

import pytest
import torch

from engine import events as ev
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.support.engine_client import Client

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
PROMPTS = ["alpha beta", "def f(x): return x * 2", "1 2 3 4 5 6 7 8", "The end."]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    from tests.support.tiny_models import make_tiny_hf

    return make_tiny_hf("gemma3", tmp_path_factory.mktemp("gemma3_hf"))


@pytest.mark.parametrize("device", DEVICES)
def test_sessions_batched_equal_alone(gemma_dir, device):
    client = Client(EngineConfig(device=device, dtype="float32", max_sessions=4, max_session_tokens=256))
    client.engine.start()
    try:
        model = client.load(gemma_dir)
        greedy = SamplingParams(max_tokens=24)
        alone = [client.tokens(client.ask(client.open(model, params=greedy), p).turn_id)
                 for p in PROMPTS]
        sids = [client.open(model, params=greedy) for _ in PROMPTS]
        turns = [client.send(sid, p) for sid, p in zip(sids, PROMPTS)]
        ends = [client.wait(t) for t in turns]
        assert all(isinstance(e, ev.Finished) for e in ends), ends
        assert [client.tokens(t) for t in turns] == alone
        assert all(client.text(t) == e.text for t, e in zip(turns, ends))
        counters = client.engine.inspect()["models"][model]
        ahead, replays = counters["lookahead_steps"], counters["graph_replays"]
        if device == "cuda":  # the GPU path really ran: graphs replayed, steps queued ahead
            assert replays > 0 and ahead > 0
    finally:
        client.engine.shutdown()
