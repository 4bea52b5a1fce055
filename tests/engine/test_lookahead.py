"""Look-ahead decoding (the next decode step queued before this one's ids are read) changes no token.

On CPU the device is synchronous, so look-ahead buys nothing here; forcing it on runs the same
bookkeeping that the CUDA path relies on: tokens dropped for sequences that finished meanwhile, the
sampler state put back, the cache left holding only history.
"""
import pytest
import torch

from bench.runs import RunConfig, make_batcher
from engine.loading.loader import load_model
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence
from tests.support.engine_helpers import run_staggered

LENGTHS = [3, 9, 17, 30, 45, 61]
ARRIVALS = [0, 0, 1, 2, 4, 7]


def _run(lookahead: bool, layout: str = "sequence") -> RunConfig:
    return RunConfig(kv_layout=layout, max_seq_len=128, step_tokens=64, chunk_tokens=8, lookahead=lookahead)


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(6, vocab, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def lm(tiny_models):
    return load_model(tiny_models["gemma3"].gguf_path)


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_greedy_tokens_equal_plain_and_lookahead_runs(lm, layout):
    params = SamplingParams(max_tokens=24)
    prompts = _prompts(lm.args.vocab_size)
    plain = run_staggered(make_batcher(lm, 6, _run(False, layout)), prompts, ARRIVALS, params)
    b = make_batcher(lm, 6, _run(True, layout))
    ahead = run_staggered(b, prompts, ARRIVALS, params)
    assert ahead == plain
    assert b.lookahead_steps > 10  # it did run ahead


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=24, repetition_penalty=1.5, presence_penalty=0.4, frequency_penalty=0.3),
    SamplingParams(max_tokens=24, temperature=0.7, top_p=0.95, top_k=40, repetition_penalty=1.1, seed=3),
    # the app's, its window short enough to slide within the answer (the pending token is its newest)
    SamplingParams(max_tokens=24, temperature=0.7, top_p=0.95, top_k=40, repetition_penalty=1.1, repeat_last_n=6,
                   seed=3),
    SamplingParams(max_tokens=24, repetition_penalty=1.5, frequency_penalty=0.3, repeat_last_n=5),
], ids=["greedy", "app-whole", "app-window", "greedy-window"])
def test_penalised_sequences_run_ahead_with_the_same_tokens(lm, params):
    """A look-ahead step's penalties count the previous step's token, which only the device holds yet."""
    prompts = _prompts(lm.args.vocab_size)
    plain = run_staggered(make_batcher(lm, 6, _run(False)), prompts, ARRIVALS, params)
    b = make_batcher(lm, 6, _run(True))
    assert run_staggered(b, prompts, ARRIVALS, params) == plain
    assert b.lookahead_steps > 10
    unpenalised = run_staggered(make_batcher(lm, 6, _run(False)), prompts, ARRIVALS,
                                SamplingParams(max_tokens=24, temperature=params.temperature, top_p=params.top_p,
                                               top_k=params.top_k, seed=params.seed))
    assert unpenalised != plain  # the penalties did change the answers


def test_stop_tokens_mid_flight_drop_the_extra_token(lm):
    """Each sequence stops on a token it meets a few steps in, while a step for it is queued ahead."""
    params = SamplingParams(max_tokens=30)
    prompts = _prompts(lm.args.vocab_size)
    free = run_staggered(make_batcher(lm, 6, _run(False)), prompts, ARRIVALS, params)
    stops = frozenset(t[3 + i] for i, t in enumerate(free))
    plain = run_staggered(make_batcher(lm, 6, _run(False)), prompts, ARRIVALS, params, stops)
    b = make_batcher(lm, 6, _run(True))
    ahead = run_staggered(b, prompts, ARRIVALS, params, stops)
    assert ahead == plain
    assert any(len(t) < params.max_tokens for t in ahead)  # some did stop early
    assert b.cache.book.free_slots == 6  # every slot came back


def _kept_run(lm, lookahead: bool, params: SamplingParams, stops: frozenset[int]):
    """Sequences keep their cache slot at the end (as the engine's sessions do); then each asks again."""
    b = make_batcher(lm, 4, _run(lookahead))
    b.release_on_finish = False
    seqs = [Sequence(i, list(p), SamplerState(params), stops) for i, p in enumerate(_prompts(lm.args.vocab_size)[:4])]
    for s in seqs:
        b.add(s)
    while b.has_work():
        b.step()
    first = [list(s.generated) for s in seqs]
    for s in seqs:  # cache, book and history agree after whatever was dropped
        assert s.num_cached <= len(s.token_ids) and b.cache.pos(s.slot) == s.num_cached
        s.token_ids.append(7)  # the next turn: one more user token, then generate again
        s.generated, s.num_prompt = [], len(s.token_ids)
        b.scheduler.resume(s)
    while b.has_work():
        b.step()
    return first, [s.generated for s in seqs]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_kept_caches_and_random_state_continue_as_without_lookahead(lm, temperature):
    params = SamplingParams(temperature=temperature, seed=5, max_tokens=20)
    free = run_staggered(make_batcher(lm, 4, _run(False)), _prompts(lm.args.vocab_size)[:4], [0] * 4, params)
    stops = frozenset(t[4] for t in free)
    plain = _kept_run(lm, False, params, stops)
    ahead = _kept_run(lm, True, params, stops)
    assert ahead == plain


def _with_a_step_ahead(lm):
    """Two sequences decoding, run until a step is queued ahead of the one being read."""
    b = make_batcher(lm, 2, _run(True))
    seqs = [Sequence(i, list(p), SamplerState(SamplingParams(max_tokens=40))) for i, p in
            enumerate(_prompts(lm.args.vocab_size)[:2])]
    for s in seqs:
        b.add(s)
    while not b.has_ahead():
        b.step()
    return b, seqs


def test_settle_reads_the_step_queued_ahead(lm):
    b, seqs = _with_a_step_ahead(lm)
    before = [len(s.generated) for s in seqs]
    got = b.settle()
    assert not b.has_ahead() and [len(s.generated) for s in seqs] == [n + 1 for n in before]
    assert {s.seq_id: t for s, t in got} == {s.seq_id: s.generated[-1] for s in seqs}
    assert all(s.num_uncached == 1 for s in seqs)  # back to the plain state: one token to feed
    b.cache.rewind(seqs[0].slot, seqs[0].num_cached - 3)  # allowed again once settled


def test_a_failed_read_drops_the_step_queued_behind_it(lm, monkeypatch):
    from engine.batcher import Launched

    b, seqs = _with_a_step_ahead(lm)

    def lost(self):
        raise RuntimeError("device lost")

    monkeypatch.setattr(Launched, "tokens", lost)
    with pytest.raises(RuntimeError, match="device lost"):
        b.step()
    assert not b.has_ahead() and set(b.in_flight) == set(seqs)  # the engine fails exactly these


def test_the_runner_says_what_the_batcher_asks(lm):
    """The runner's interface to the batcher; on CPU the device is the host, so no look-ahead by default."""
    b = make_batcher(lm, 2, _run(None))
    runner = b.runner
    assert runner.prefers_lookahead is False and b.lookahead is False
    assert runner.accepts_device_tokens(2) and runner.host_ids(torch.zeros(2, dtype=torch.long)) is None


def test_more_sequences_than_the_drafter_serves_still_run_ahead(lm):
    """A drafter drafts for at most `max_sequences` decoding sequences a step: beyond that no step verifies drafts,
    so steps run ahead as without a drafter; at or below it, a sequence due to draft waits for its ids."""
    from engine.speculative import make_drafter

    params = SamplingParams(max_tokens=24)
    prompts = _prompts(lm.args.vocab_size)
    plain = run_staggered(make_batcher(lm, 6, _run(False)), prompts, ARRIVALS, params)
    ahead = {}
    for most in (2, 6):
        b = make_batcher(lm, 6, _run(True))
        b.drafter = make_drafter("lookup")
        b.drafter.max_sequences = most
        assert run_staggered(b, prompts, ARRIVALS, params) == plain
        ahead[most] = b.lookahead_steps
    assert ahead[6] < ahead[2], ahead
