"""Sampling's ranking in the CPU library (kernels/cpu/sampling.c) against torch's softmax and topk."""
import pytest
import torch

from kernels.cpu_native import cpu_kernel
from kernels.cpu_sampling import top_rows
from tests.support.sampling_reference import plain_top_draw

pytestmark = pytest.mark.skipif(cpu_kernel() is None, reason="the CPU kernel does not build here")


@pytest.mark.parametrize("vocab, k", [(262_144, 40), (1000, 256), (37, 37), (9, 1), (5003, 2048)])
def test_the_k_most_likely_tokens_and_their_probabilities(vocab, k):
    g = torch.Generator().manual_seed(vocab + k)
    rows = torch.randn(3, vocab, generator=g) * 4
    temps = [0.7, 1.0, 2.5]
    probs, ids = top_rows(rows, temps, k)
    exact = torch.softmax(rows.double() / torch.tensor(temps, dtype=torch.float64)[:, None], dim=-1)
    want = exact.topk(k, dim=-1)
    assert torch.equal(ids, want.indices)
    assert torch.allclose(probs.double(), want.values, rtol=2e-6, atol=0)  # closer than torch's fp32 softmax here


def test_equal_logits_rank_by_id_and_odd_rows_stay_in_range():
    rows = torch.zeros(2, 100)
    rows[0, [70, 10, 40]] = 3.0  # a tie at the top: the smaller id first
    rows[1, 50] = float("nan")  # a broken row: valid ids, whatever the values
    probs, ids = top_rows(rows, [1.0, 1.0], 5)
    assert ids[0, :3].tolist() == [10, 40, 70] and ids[0, 3:].tolist() == [0, 1]
    assert ((ids >= 0) & (ids < 100)).all()
    assert torch.allclose(probs[0, :3].sum(), torch.softmax(rows[0], 0)[[10, 40, 70]].sum())


def test_rows_are_ranked_alone_however_many_share_the_call():
    rows = torch.randn(6, 4096, generator=torch.Generator().manual_seed(1))
    temps = [0.5, 0.8, 1.0, 1.2, 3.0, 0.9]
    batched = top_rows(rows, temps, 64)
    for i in range(6):
        alone = top_rows(rows[i : i + 1], temps[i : i + 1], 64)
        assert torch.equal(alone[1][0], batched[1][i]) and torch.equal(alone[0][0], batched[0][i])


def test_what_the_library_cannot_take_is_left_to_torch():
    rows = torch.randn(2, 50)
    assert top_rows(rows, [1.0, 1.0], 0) is None and top_rows(rows, [1.0, 1.0], 51) is None


def test_a_draw_from_the_whole_row_is_where_the_exact_cumulative_sum_passes_u():
    from kernels.cpu_sampling import draw_rows

    g = torch.Generator().manual_seed(2)
    rows = torch.randn(5, 3000, generator=g) * 3
    rows[:, 600:1100] = float("-inf")  # a whole block and parts of two more of probability 0
    temps = [1.0, 0.6, 2.0, 1.0, 1.0]
    for _ in range(40):
        u = torch.rand(5, dtype=torch.float64, generator=g)
        u[3], u[4] = 0.0, 1 - 2**-53  # the ends
        ids = draw_rows(rows, temps, u.tolist())
        probs = torch.softmax(rows.double() / torch.tensor(temps, dtype=torch.float64)[:, None], dim=-1)
        cum = probs.cumsum(-1)
        want = torch.searchsorted(cum, (u[:, None] * cum[:, -1:]).clamp(max=1 - 1e-12), right=True)[:, 0]
        assert (probs.gather(1, ids[:, None]) > 0).all()  # never a token of probability 0
        assert torch.equal(ids, want)


def test_a_whole_filtered_draw_equals_the_plain_definition():
    """Top-k rows, and open rows (top_k 0): their nucleus found in the first tokens ranked, or past them (a flat row,
    temperature 8: the whole row's selection by mass)."""
    from kernels.cpu_sampling import sample_top

    g = torch.Generator().manual_seed(11)
    cases = [(40, 0.7, 0.95, 0.0), (5, 1.0, 1.0, 0.0), (200, 1.3, 0.9, 0.05), (64, 0.5, 0.5, 0.0),
             (1, 1.0, 1.0, 0.0), (300, 1.0, 1.0, 0.2), (50, 2.0, 0.3, 0.0),
             (0, 1.0, 0.9, 0.0), (0, 0.7, 1.0, 0.05), (0, 8.0, 0.9, 0.0), (0, 8.0, 1.0, 0.3), (0, 8.0, 0.5, 0.2)]
    checked = 0
    for trial in range(12):
        rows = torch.randn(len(cases), 3000, generator=g) * 3
        if trial % 3 == 0:
            rows = rows.round()  # many equal logits: ties ranked by id
        u = torch.rand(len(cases), generator=g, dtype=torch.float64).tolist()
        ids = sample_top(rows, *[list(c) for c in zip(*cases)], u)
        for r, (k, t, top_p, min_p) in enumerate(cases):
            want, margin = plain_top_draw(rows[r], k, t, top_p, min_p, u[r])
            if margin > 1e-6:  # not at a boundary, where fp32 logits / t round either way
                assert int(ids[r]) == want, (trial, r)
                checked += 1
            alone = sample_top(rows[r : r + 1], [k], [t], [top_p], [min_p], [u[r]])
            assert int(alone[0]) == int(ids[r])  # a row draws the same alone as batched
    assert checked > 120


def test_open_rows_over_a_wide_vocabulary_with_masked_tokens():
    """Flat open rows over many blocks (the nucleus found by buckets of the weights' mass, the draw by blocks), a
    masked span of -inf: the plain definition's token, never a masked one; a row of NaN still gives a valid id."""
    from kernels.cpu_sampling import sample_top

    g = torch.Generator().manual_seed(12)
    vocab = 20_000
    cases = [(0, 8.0, 0.9, 0.0), (0, 4.0, 0.97, 0.0), (0, 6.0, 1.0, 0.1), (0, 8.0, 0.6, 0.3), (0, 3.0, 0.8, 0.0)]
    checked = 0
    for trial in range(4):
        rows = torch.randn(len(cases), vocab + trial, generator=g) * 3  # rows not a multiple of 8 too
        rows[:, 5000:7000] = float("-inf")
        if trial % 2:
            rows = rows.round()  # ties at the nucleus's end, kept by id
        u = torch.rand(len(cases), generator=g, dtype=torch.float64).tolist()
        ids = sample_top(rows, *[list(c) for c in zip(*cases)], u)
        for r, (k, t, top_p, min_p) in enumerate(cases):
            assert not 5000 <= int(ids[r]) < 7000
            want, margin = plain_top_draw(rows[r], k, t, top_p, min_p, u[r])
            if margin > 1e-6:
                assert int(ids[r]) == want, (trial, r)
                checked += 1
    assert checked > 10
    broken = torch.full((1, vocab), float("nan"))
    assert 0 <= int(sample_top(broken, [0], [1.0], [0.9], [0.0], [0.5])[0]) < vocab


@pytest.mark.parametrize("frequency", [0.0, 0.4])
def test_penalties_in_the_library_equal_torch_s_bit_for_bit_and_come_back(monkeypatch, frequency):
    from engine import sampling
    from engine.sampling import SamplerState, SamplingParams, penalise

    g = torch.Generator().manual_seed(4)
    vocab = 3000
    logits = torch.randn(5, vocab, generator=g) * 4
    params = [SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=frequency),
              SamplingParams(),  # no penalties: untouched
              SamplingParams(repetition_penalty=2.0, repeat_last_n=16),
              SamplingParams(presence_penalty=-0.7, frequency_penalty=frequency),
              SamplingParams(repetition_penalty=0.8)]
    histories = [[int(t) for t in torch.randint(0, 60, (700,), generator=g)],  # many repeats
                 [1, 2, 3],
                 [int(t) for t in torch.randint(0, vocab, (100,), generator=g)],
                 [5, 5, 5, 9],
                 []]
    states = [SamplerState(p) for p in params]
    pending = torch.tensor([7, 7, 2999, 5, 0])
    library = [penalise(logits, states, histories), penalise(logits, states, histories, pending)]
    monkeypatch.setattr(sampling, "penalise_rows", lambda *a: None)  # torch's operations
    assert torch.equal(library[0], penalise(logits, states, histories))
    assert torch.equal(library[1], penalise(logits, states, histories, pending))
    assert not torch.equal(library[0], logits) and torch.equal(library[0][1], logits[1])
    monkeypatch.undo()
    out = logits.clone()
    with sampling._penalties(out, states, histories, pending) as (penalised, changed):
        assert changed and penalised is out and torch.equal(out, library[1])
    assert torch.equal(out, logits)  # the originals put back
