"""Logit bias (engine/logit_bias.py): numbers added to chosen tokens' logits before sampling, on every row a sampler
owns (a verify step's drafts too); batched equals alone; log-probabilities stay the model's own."""
from __future__ import annotations

import random

import pytest
import torch

from bench.runs import RunConfig, make_batcher
from engine.errors import ParleyError
from engine.loading.loader import load_model
from engine.logit_bias import check_bias_ids
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence
from tests.engine.test_speculative import ScriptedDrafter
from tests.support.engine_helpers import full_logits, staggered_sequences


@pytest.fixture(scope="module")
def lm(tiny_models):
    return load_model(tiny_models["llama"].gguf_path)


def _run(lm, prompts, params, run: RunConfig, arrivals=None, drafter=None) -> list[Sequence]:
    batcher = make_batcher(lm, len(prompts), run)
    batcher.drafter = drafter
    return staggered_sequences(batcher, prompts, arrivals or [0] * len(prompts), params)


def _prompts(lm) -> list[list[int]]:
    rng = random.Random(9)
    phrase = [rng.randrange(6, lm.args.vocab_size) for _ in range(6)]
    return [phrase * 4, [rng.randrange(6, lm.args.vocab_size) for _ in range(11)] + phrase * 2, phrase * 3]


def _greedy_reference(lm, prompt: list[int], bias: dict[int, float], n: int) -> list[int]:
    """Greedy decoding by full forwards, the bias added to each position's logits: what the engine must choose."""
    ids = list(prompt)
    for _ in range(n):
        row = full_logits(lm, ids)[-1].clone()
        for token, value in bias.items():
            row[token] += value
        ids.append(int(row.argmax()))
    return ids[len(prompt):]


def test_a_bias_moves_greedy_choices_as_the_reference_does(lm):
    prompt = _prompts(lm)[1]
    plain = _run(lm, [prompt], [SamplingParams(max_tokens=10)], RunConfig(max_seq_len=64))[0].generated
    bias = {plain[0]: -100.0, plain[1]: -100.0, 7: 3.5}  # the first choices banned, another token raised
    got = _run(lm, [prompt], [SamplingParams(max_tokens=10, logit_bias=bias)], RunConfig(max_seq_len=64))[0]
    assert got.generated == _greedy_reference(lm, prompt, bias, 10) != plain
    assert plain[0] not in got.generated and plain[1] not in got.generated
    forced = _run(lm, [prompt], [SamplingParams(max_tokens=6, logit_bias={9: 100.0})], RunConfig(max_seq_len=64))[0]
    assert forced.generated == [9] * 6


def test_sampled_rows_never_draw_a_banned_token(lm):
    prompt = _prompts(lm)[0]
    free = _run(lm, [prompt] * 3, [SamplingParams(max_tokens=40, temperature=1.5, seed=s) for s in range(3)],
                RunConfig(max_seq_len=96))
    common = {t for s in free for t in s.generated}
    banned = {t: -100.0 for t in common}
    seqs = _run(lm, [prompt] * 3, [SamplingParams(max_tokens=40, temperature=1.5, seed=s, logit_bias=banned)
                                   for s in range(3)], RunConfig(max_seq_len=96))
    assert not common & {t for s in seqs for t in s.generated}


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_biased_sessions_verifying_drafts_batched_equal_alone(lm, layout):
    """Biased and unbiased sessions in one batcher, every one verifying drafts kept whole, in part and not at all: a
    verify step's rows all carry their sampler's bias, and each sequence's tokens are those it makes alone."""
    prompts = _prompts(lm)
    alone_plain = _run(lm, prompts[:1], [SamplingParams(max_tokens=4)], RunConfig(max_seq_len=96))[0].generated
    bias = {alone_plain[1]: -100.0, 11: 4.0}
    params = [SamplingParams(max_tokens=20, logit_bias=bias), SamplingParams(max_tokens=20),
              SamplingParams(max_tokens=20, logit_bias={alone_plain[0]: -100.0})]
    run = RunConfig(kv_layout=layout, max_seq_len=96, step_tokens=24, chunk_tokens=8)
    alone = [_run(lm, [p], [q], run)[0].generated for p, q in zip(prompts, params)]
    drafter = ScriptedDrafter(dict(enumerate(alone)), wrong=4, vocab=lm.args.vocab_size)
    seqs = _run(lm, prompts, params, run, arrivals=[0, 1, 3], drafter=drafter)
    assert [s.generated for s in seqs] == alone
    assert 0 < drafter.accepted < drafter.drafted and seqs[0].num_accepted > 0


def test_log_probabilities_of_a_biased_answer_are_the_models_own(lm):
    prompt = _prompts(lm)[1]
    bias = {5: 100.0}
    seq = _run(lm, [prompt], [SamplingParams(max_tokens=5, logprobs=1, logit_bias=bias)], RunConfig(max_seq_len=64))[0]
    assert seq.generated == [5] * 5
    want = torch.log_softmax(full_logits(lm, prompt + seq.generated[:-1]).double(), dim=-1)[len(prompt) - 1 :]
    batcher = make_batcher(lm, 1, RunConfig(max_seq_len=64))
    again = Sequence(0, list(prompt), SamplerState(SamplingParams(max_tokens=5, logprobs=1, logit_bias=bias)))
    batcher.add(again)
    found = []
    while batcher.has_work():
        batcher.step()
        found += again.step_logprobs
    assert all(abs(lp.logprob - row[5].item()) < 1e-4 for lp, row in zip(found, want)) and len(found) == 5


@pytest.mark.parametrize("bias,message", [
    ({-1: 1.0}, "keys must be token ids"), ({"3": 1.0}, "keys must be token ids"), ({True: 1.0}, "keys must be"),
    ({3: 101.0}, "between ±100"), ({3: float("nan")}, "between ±100"), ({3: "1"}, "between ±100"),
    ([3], "must map at most"), ({i: 1.0 for i in range(1025)}, "must map at most 1024"),
])
def test_bad_biases_are_refused(bias, message):
    with pytest.raises(ParleyError, match=message):
        SamplingParams(logit_bias=bias)


def test_an_id_past_the_vocabulary_is_named():
    assert check_bias_ids({3: 1.0, 70_000: -5.0, 90_000: 1.0}, 65_536) == (
        "logit_bias names token 70000, but this model's vocabulary has 65,536 tokens (ids 0-65535).")
    assert check_bias_ids({3: 1.0}, 65_536) is None and check_bias_ids(None, 10) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (decode graphs)")
def test_on_cuda_biased_rows_beside_graph_steps_and_look_ahead(tiny_models):
    """On CUDA with decode graphs and look-ahead: biased steps leave the graph's argmax for their own, the bias goes
    on the look-ahead steps too, and each sequence batched equals itself alone."""
    from engine.loading.loader import LoadOptions

    lm = load_model(tiny_models["llama"].gguf_path, LoadOptions(device="cuda", dtype="bfloat16"))
    prompts = _prompts(lm)
    params = [SamplingParams(max_tokens=16, logit_bias={9: 100.0}), SamplingParams(max_tokens=16),
              SamplingParams(max_tokens=16, temperature=1.0, seed=3, logit_bias={t: -100.0 for t in range(6, 400)})]
    run = RunConfig(max_seq_len=128, lookahead=True)
    alone = [_run(lm, [p], [q], run)[0].generated for p, q in zip(prompts, params)]
    seqs = _run(lm, prompts, params, run, arrivals=[0, 1, 2])
    assert [s.generated for s in seqs] == alone
    assert alone[0] == [9] * 16 and all(t < 6 or t >= 400 for t in alone[2])
