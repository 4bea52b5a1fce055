"""The scheduler's budget: a prompt that arrives while others decode starts before they end, whatever the budget,
and every sequence's tokens stay those it generates alone."""
import pytest
import torch

from bench.runs import RunConfig, make_batcher
from engine.loading.loader import load_model
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence, Status
from tests.support.engine_helpers import alone


@pytest.fixture(scope="module")
def lm(tiny_models):
    return load_model(tiny_models["llama"].gguf_path)


@pytest.mark.parametrize("step, chunk", [(16, 16), (17, 16), (64, 16)])
def test_a_prompt_arriving_while_others_decode_starts_before_they_end(lm, step, chunk):
    """With step_tokens == chunk_tokens two decodes left no room for a chunk: the prompt waited for both answers."""
    run = RunConfig(max_seq_len=256, step_tokens=step, chunk_tokens=chunk)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(6, lm.args.vocab_size, (n,), generator=g).tolist() for n in (5, 7, 70)]
    params = [SamplingParams(max_tokens=60), SamplingParams(max_tokens=60), SamplingParams(max_tokens=3)]
    b = make_batcher(lm, 3, run)
    seqs = [Sequence(i, list(p), SamplerState(sp)) for i, (p, sp) in enumerate(zip(prompts, params))]
    b.add(seqs[0]), b.add(seqs[1])
    for _ in range(4):  # both decoding
        b.step()
    b.add(seqs[2])
    order = []
    while b.has_work():
        b.step()
        order += [s.seq_id for s in seqs if s.status == Status.FINISHED and s.seq_id not in order]
    assert order.index(2) < order.index(0) and order.index(2) < order.index(1), order
    for seq, prompt, sp in zip(seqs, prompts, params):
        assert seq.generated == alone(lm, prompt, sp, run)
