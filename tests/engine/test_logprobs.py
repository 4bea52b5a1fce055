"""Log-probabilities of the chosen tokens (engine/logprobs.py): the model's own distribution at each position (before
temperature and penalties), and the same numbers batched and alone, with and without verified drafts."""
from __future__ import annotations

import pytest
import torch

from bench.runs import RunConfig, make_batcher
from engine.errors import ParleyError
from engine.loading.loader import load_model
from engine.logprobs import MAX_TOP, TokenLogprob
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence
from tests.engine.test_speculative import ScriptedDrafter
from tests.support.engine_helpers import full_logits


@pytest.fixture(scope="module")
def lm(tiny_models):
    return load_model(tiny_models["llama"].gguf_path)


def _generate(lm, prompts: list[list[int]], params: SamplingParams, run: RunConfig, arrivals: list[int] | None = None,
              drafter=None) -> tuple[list[list[int]], list[list[TokenLogprob]], int]:
    """Each prompt's tokens and their log-probabilities, the prompts arriving at `arrivals` (steps) in one batcher;
    and the drafts kept over all of them."""
    batcher = make_batcher(lm, len(prompts), run)
    if drafter is not None:
        batcher.drafter = drafter
    seqs = [Sequence(i, list(p), SamplerState(params)) for i, p in enumerate(prompts)]
    arrivals = arrivals or [0] * len(prompts)
    found: list[list[TokenLogprob]] = [[] for _ in prompts]
    step = 0
    while step <= max(arrivals) or batcher.has_work():
        for seq, at in zip(seqs, arrivals):
            if at == step:
                batcher.add(seq)
        for seq in {id(s): s for s, _ in batcher.step()}.values():
            found[seq.seq_id] += seq.step_logprobs
        step += 1
    return [s.generated for s in seqs], found, sum(s.num_accepted for s in seqs)


def _prompts(vocab: int) -> list[list[int]]:
    """Prompts that repeat themselves (prompt lookup drafts from them), and one that does not."""
    g = torch.Generator().manual_seed(3)
    phrase = torch.randint(6, vocab, (7,), generator=g).tolist()
    return [phrase * 4, torch.randint(6, vocab, (13,), generator=g).tolist() + phrase * 2, phrase * 3 + [9]]


def test_each_logprob_is_the_models_log_softmax_at_its_position(lm):
    prompt = _prompts(lm.args.vocab_size)[1]
    params = SamplingParams(max_tokens=12, temperature=1.5, seed=11, logprobs=4)  # drawn: not always the top token
    (tokens,), (lps,), _ = _generate(lm, [prompt], params, RunConfig(max_seq_len=64))
    want = torch.log_softmax(full_logits(lm, prompt + tokens[:-1]).double(), dim=-1)[len(prompt) - 1 :]
    assert [lp.token for lp in lps] == tokens
    for row, lp in zip(want, lps):
        assert abs(lp.logprob - row[lp.token].item()) < 1e-4
        values, ids = row.topk(4)
        assert [i for i, _ in lp.top] == ids.tolist()
        assert all(abs(v - w) < 1e-4 for (_, v), w in zip(lp.top, values.tolist()))
    assert any(lp.token != lp.top[0][0] for lp in lps)  # a drawn token's own number, not the top one's


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_batched_and_drafted_equal_alone(lm, layout):
    """The numbers of each token are those of the same prompt decoded alone without drafts, with drafts kept whole,
    in part and not at all: a verify step's rows are read in the right order."""
    prompts = _prompts(lm.args.vocab_size)
    params = SamplingParams(max_tokens=16, logprobs=3)
    run = RunConfig(kv_layout=layout, max_seq_len=96, step_tokens=24, chunk_tokens=8)
    alone = [_generate(lm, [p], params, run) for p in prompts]
    drafter = ScriptedDrafter({i: tokens[0] for i, (tokens, _, _) in enumerate(alone)}, wrong=4,
                              vocab=lm.args.vocab_size)
    tokens, lps, kept = _generate(lm, prompts, params, run, arrivals=[0, 1, 3], drafter=drafter)
    assert 0 < kept and drafter.accepted < drafter.drafted
    assert tokens == [t[0] for t, _, _ in alone]
    for got, (_, (want,), _) in zip(lps, alone):
        assert len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))


def _same(a: TokenLogprob, b: TokenLogprob) -> bool:
    """The same token and ranking, the numbers within float32 rounding (this float model's products differ in their
    last bit with the step's rows; its tokens do not)."""
    close = abs(a.logprob - b.logprob) < 1e-5 and all(abs(x[1] - y[1]) < 1e-5 for x, y in zip(a.top, b.top))
    return close and a.token == b.token and [t for t, _ in a.top] == [t for t, _ in b.top]


def test_none_asked_none_computed(lm):
    _, lps, _ = _generate(lm, _prompts(lm.args.vocab_size)[:2], SamplingParams(max_tokens=4), RunConfig(max_seq_len=64))
    assert lps == [[], []]


@pytest.mark.parametrize("bad", [-1, MAX_TOP + 1, True, 2.0])
def test_a_count_out_of_range_or_not_an_integer_is_refused(bad):
    with pytest.raises(ParleyError, match="logprobs"):
        SamplingParams(logprobs=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (decode graphs)")
def test_on_the_decode_graphs_each_number_is_read_from_its_own_row():
    """Replayed decode graphs write their logits into one buffer: each token's numbers are those of its own step's row
    (not a later step's), and asking for them (which stops steps running ahead) leaves the tokens as they were."""
    from bench.decode_gpu import gemma270m_args, parley_model, prompts, random_hf_weights
    from tests.engine.test_cuda_runner import generate, make_batcher as cuda_batcher

    args = gemma270m_args(max_len=512)
    model = parley_model(args, random_hf_weights(args, seed=0), torch.bfloat16, "cuda")
    ids = [p[:n] for p, n in zip(prompts(args, 4, length=80), [5, 17, 40, 80])]

    def run(params: SamplingParams):
        b = cuda_batcher(model, args, 4, 200, graphs=True)
        found, real_step = {i: [] for i in range(4)}, b.step

        def step():  # each step's numbers, read as the engine thread reads them
            out = real_step()
            for seq in {id(s): s for s, _ in out}.values():
                found[seq.seq_id] += seq.step_logprobs
            return out

        b.step = step
        tokens, rows = generate(b, ids, [0] * 4, 24, params)
        return tokens, found, rows, b

    tokens, found, rows, b = run(SamplingParams(max_tokens=24, logprobs=3))
    assert b.runner.graphs.replays >= 20 and b.lookahead_steps == 0
    for i, seq_tokens in enumerate(tokens):
        assert [lp.token for lp in found[i]] == seq_tokens
        for lp, row in zip(found[i], rows[i]):
            want = torch.log_softmax(row.cpu(), dim=-1)
            assert abs(lp.logprob - want[lp.token].item()) < 1e-4
            # bf16 logits tie often: the listed ids are of the top 3 values, each with its own value
            assert all(abs(v - w) < 1e-4 for (_, v), w in zip(lp.top, want.topk(3).values.tolist()))
            assert all(abs(v - want[t].item()) < 1e-4 for t, v in lp.top)
    plain, _, _, ahead = run(SamplingParams(max_tokens=24))
    assert ahead.lookahead_steps > 0 and plain == tokens
