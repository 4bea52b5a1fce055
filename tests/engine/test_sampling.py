"""Sampler distributions: temperature, top-k, top-p, min-p and penalties, drawn many times."""
from array import array
from dataclasses import replace

import pytest
import torch

from engine.errors import ParleyError
from engine.sampling import SamplerState, SamplingParams, penalised, sample_ids

PROBS = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
LOGITS = PROBS.log()


def sample(logits: torch.Tensor, states: list[SamplerState], histories: list[list[int]], positions=None) -> list[int]:
    return sample_ids(logits, states, histories, positions=positions).tolist()


def _freqs(params: SamplingParams, n: int = 4000, history=None) -> torch.Tensor:
    state = SamplerState(params)
    counts = torch.zeros(len(PROBS))
    for k in range(n // 100):
        states = [state] * 100  # one sampler, many rows at different positions: each has its own noise
        ids = sample(LOGITS.expand(100, -1).clone(), states, [history or []] * 100, list(range(k * 100, k * 100 + 100)))
        counts += torch.bincount(torch.tensor(ids), minlength=len(PROBS))
    return counts / counts.sum()


def test_temperature_one_follows_the_distribution():
    f = _freqs(SamplingParams(temperature=1.0, seed=0))
    assert torch.allclose(f, PROBS, atol=0.03)


def test_top_k_keeps_k_renormalised():
    f = _freqs(SamplingParams(temperature=1.0, top_k=2, seed=1))
    assert f[2:].sum() == 0
    assert torch.allclose(f[:2], PROBS[:2] / PROBS[:2].sum(), atol=0.03)


def test_top_p_keeps_the_smallest_set_reaching_p():
    f = _freqs(SamplingParams(temperature=1.0, top_p=0.7, seed=2))  # 0.4 + 0.3 reaches 0.7
    assert f[2:].sum() == 0
    f = _freqs(SamplingParams(temperature=1.0, top_p=0.75, seed=3))
    assert f[2] > 0 and f[3:].sum() == 0


def test_min_p_drops_tokens_below_a_share_of_the_top():
    f = _freqs(SamplingParams(temperature=1.0, min_p=0.3, seed=4))  # threshold 0.12
    assert f[3:].sum() == 0 and f[2] > 0


def test_low_temperature_sharpens():
    f = _freqs(SamplingParams(temperature=0.2, seed=5))
    assert f[0] > 0.75


def test_greedy_ignores_the_generator():
    assert set(_freqs(SamplingParams(temperature=0.0), n=300).nonzero().flatten().tolist()) == {0}


def test_a_step_s_own_argmax_is_used_unless_penalties_change_the_logits():
    """Greedy rows take the ids the step computed (a decode graph's argmax); a penalty recomputes them; a
    drawing row is written into a copy, never into the step's buffer."""
    logits = LOGITS.expand(3, -1).clone()
    given = torch.tensor([4, 3, 2])  # deliberately not the logits' argmax: shows which one was used
    greedy = SamplerState(SamplingParams(temperature=0.0))
    assert sample_ids(logits, [greedy] * 3, [[]] * 3, given) is given
    penalised = SamplerState(SamplingParams(temperature=0.0, repetition_penalty=50.0))
    assert sample_ids(logits, [greedy, penalised, greedy], [[], [0], []], given).tolist() == [0, 1, 0]
    drawing = SamplerState(SamplingParams(temperature=1.0, top_k=1, seed=1))
    ids = sample_ids(logits, [greedy, drawing, greedy], [[]] * 3, given)
    assert ids.tolist() == [4, 0, 2] and given.tolist() == [4, 3, 2]


def test_repetition_penalty_lowers_seen_tokens():
    f = _freqs(SamplingParams(temperature=1.0, repetition_penalty=3.0, seed=6), history=[0])
    assert f[0] < 0.2  # 0.4 before: its logit (negative) was multiplied by 3


def test_presence_and_frequency_penalties():
    f = _freqs(SamplingParams(temperature=1.0, presence_penalty=2.0, seed=7), history=[0, 1])
    assert f[0] < 0.15 and f[1] < 0.12
    g = _freqs(SamplingParams(temperature=1.0, frequency_penalty=1.0, seed=8), history=[0, 0, 0])
    assert g[0] < 0.05


def test_a_draw_depends_on_the_turn_key_and_position_only():
    """Seeded: the same tokens at the same positions, however often or in whatever order they are drawn (a dropped
    look-ahead draw or a verify step's extra rows change nothing); unseeded: each turn draws afresh."""
    a, b = SamplerState(SamplingParams(temperature=1.0, seed=42)), SamplerState(SamplingParams(temperature=1.0, seed=42))
    rows = LOGITS.expand(1, -1)
    history = [1] * 3
    first = [sample(rows.clone(), [a], [history * p]) for p in range(20)]
    sample(rows.clone(), [b], [[]])  # an extra draw at another position first
    assert first == [sample(rows.clone(), [b], [history * p]) for p in reversed(range(20))][::-1]
    assert len({f[0] for f in first}) > 1  # positions draw independently
    unseeded = SamplerState(SamplingParams(temperature=1.0))
    turns = []
    for _ in range(3):
        unseeded.begin_turn()
        turns.append([sample(rows.clone(), [unseeded], [], [p])[0] for p in range(20)])
    assert turns[0] != turns[1] != turns[2]


# a repetition penalty of 1e-300 is 0 in fp32: every seen token's logit became inf and the answer was token 0 or BOS
# over and over ('--repetition-penalty 1e-300' on the embedded model: 8 of 8 tokens <bos>), without a word
@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(min_p=1), dict(max_tokens=0), dict(top_k=-1),
                                 dict(repetition_penalty=1e-300), dict(repetition_penalty=0.0099)])
def test_invalid_params_are_clear_errors(bad):
    with pytest.raises(ParleyError, match="Invalid sampling setting"):
        SamplingParams(**bad)


# -- the filters rank only the tokens they can keep: the same distribution as the plain definition over a sorted row
def _plain(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Softmax at the temperature over the whole row, sorted; top-k, then top-p (the mass above a token, of the
    top-k's mass renormalised, as llama.cpp and transformers), min-p."""
    probs = torch.softmax(logits / p.temperature, dim=-1)
    sorted_p, order = probs.sort(descending=True)
    rank = torch.arange(len(probs))
    in_k = rank < (p.top_k or len(probs))
    nucleus = p.top_p * sorted_p[in_k].sum()
    keep = in_k & ((sorted_p.cumsum(0) - sorted_p < nucleus) | (p.top_p >= 1))
    keep &= sorted_p >= p.min_p * sorted_p[0]
    keep[0] = True
    out = torch.zeros_like(probs).scatter(0, order, sorted_p * keep)
    return out / out.sum()


FILTERS = [
    dict(temperature=0.7, top_k=40, top_p=0.95),
    dict(temperature=1.5, top_p=0.9),  # a flat row: the nucleus lies far past the first tokens ranked
    dict(temperature=2.0, min_p=0.001),  # min-p's boundary past them too
    dict(temperature=1.0, top_k=3000),  # top-k wider than the first ranking
    dict(temperature=0.5, top_p=0.5, min_p=0.2),
    dict(temperature=1.0),  # no filter: the whole row
]


@pytest.fixture(params=["library", "torch"])
def ranking(request, monkeypatch):
    """The CPU library's ranking (where built), and torch's softmax and topk."""
    if request.param == "torch":
        monkeypatch.setattr("engine.sampling.top_rows", lambda *args: None)
    return request.param


def test_filters_equal_the_plain_definition_row_by_row_and_mixed(ranking):
    from engine.sampling import probabilities

    logits = torch.randn(len(FILTERS), 20_000, generator=torch.Generator().manual_seed(3)) * 2
    states = [SamplerState(SamplingParams(**f)) for f in FILTERS]
    mixed = probabilities(logits, states)  # every kind of row in one batch
    for i, state in enumerate(states):
        want = _plain(logits[i], state.params)
        alone = probabilities(logits[i : i + 1], [state])[0]
        assert torch.equal((alone > 0), (want > 0)) and torch.equal((mixed[i] > 0), (want > 0)), FILTERS[i]
        assert torch.allclose(alone, want, atol=1e-7) and torch.allclose(mixed[i], want, atol=1e-7), FILTERS[i]
    assert 300 < int((mixed[1] > 0).sum()) < 20_000  # the flat row's nucleus did need the widening


def test_a_nucleus_past_the_widest_selection_sorts_the_whole_row(ranking):
    from engine.sampling import WIDEST, probabilities

    logits = torch.randn(2, 3 * WIDEST, generator=torch.Generator().manual_seed(12)) * 0.3  # nearly flat
    states = [SamplerState(SamplingParams(temperature=1.0, top_p=0.95)),
              SamplerState(SamplingParams(temperature=1.0, min_p=0.2))]
    got = probabilities(logits, states)
    for i, state in enumerate(states):
        want = _plain(logits[i], state.params)
        assert torch.equal(got[i] > 0, want > 0) and torch.allclose(got[i], want, atol=1e-7)
    assert int((got[0] > 0).sum()) > WIDEST and int((got[1] > 0).sum()) > WIDEST


def test_draws_are_the_same_alone_and_batched_and_follow_a_wide_nucleus(ranking):
    """A token depends on its row's logits, the turn's key and the position only, whatever shares the step; a flat
    top-p row (ranked past the first width) draws its nucleus in proportion."""
    logits = torch.randn(len(FILTERS), 5_000, generator=torch.Generator().manual_seed(4))
    states = [SamplerState(SamplingParams(seed=9 + i, **f)) for i, f in enumerate(FILTERS)]
    for position in range(20):
        batched = sample(logits, states, [[]] * len(states), [position] * len(states))
        assert batched == [sample(logits[i : i + 1], [s], [[]], [position])[0] for i, s in enumerate(states)]
    state = SamplerState(SamplingParams(temperature=3.0, top_p=0.5, seed=1))
    row = torch.linspace(0, 1, 2_000)[None, :]  # a nucleus of ~1,100 tokens
    ids = torch.tensor([sample(row, [state], [[]], [p])[0] for p in range(3_000)])
    from engine.sampling import probabilities

    want = probabilities(row, [state])[0]
    assert set(ids.tolist()) <= set(want.nonzero().flatten().tolist())
    inside = want > 0  # the upper half of the nucleus should hold its share of the draws
    upper = want.nonzero().flatten()[int(inside.sum()) // 2 :]
    share = float(want[upper].sum())
    assert abs(float(torch.isin(ids, upper).float().mean()) - share) < 0.04


def _plain_penalties(logits: torch.Tensor, states: list[SamplerState], histories: list[list[int]]) -> torch.Tensor:
    out = logits.clone()
    for i, (s, h) in enumerate(zip(states, histories)):
        p = s.params
        h = h if p.repeat_last_n < 0 else h[len(h) - p.repeat_last_n :] if p.repeat_last_n else []
        for tok in set(h):
            v = out[i, tok]
            v = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
            out[i, tok] = v - p.presence_penalty - p.frequency_penalty * h.count(tok)
    return out


def test_penalties_batched_equal_a_plain_loop_and_count_a_pending_token():
    from engine.sampling import penalise

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(5)) * 3
    states = [SamplerState(SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25)),
              SamplerState(SamplingParams()),  # no penalty: untouched
              SamplerState(SamplingParams(frequency_penalty=1.0)),
              SamplerState(SamplingParams(repetition_penalty=2.0))]
    histories = [[1, 2, 2, 9, 2], [3, 4], [7, 7, 7], []]
    assert torch.allclose(penalise(logits, states, histories), _plain_penalties(logits, states, histories), atol=1e-6)
    pending = torch.tensor([2, 5, 8, 0])  # a look-ahead step's input, not in the host's histories yet
    with_pending = [h + [int(t)] for h, t in zip(histories, pending)]
    assert torch.equal(penalise(logits, states, histories, pending), penalise(logits, states, with_pending))


def test_penalised_sampling_leaves_the_logits_as_they_came_and_reads_arrays_as_lists():
    """Penalties are written into the step's logits and taken back: the buffer is the runner's, and what else reads
    it (a verify row, a drafter) must see the model's values."""
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(4, 300, generator=gen) * 4
    before = logits.clone()
    params = [SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5),  # greedy, penalised
              SamplingParams(temperature=0.9, top_k=20, repetition_penalty=1.2, seed=1),
              SamplingParams(temperature=0.7, seed=2),  # no penalty
              SamplingParams(temperature=1.1, top_p=0.9, presence_penalty=1.0, seed=3)]
    histories = [[int(t) for t in torch.randint(0, 300, (n,), generator=gen)] for n in (40, 7, 12, 90)]
    pending = torch.tensor([3, 3, 250, 17])
    want = _penalised_first(logits, params, histories)
    for hist in (histories, [array("q", h) for h in histories]):
        assert sample_ids(logits, _states(params), hist).tolist() == want
        assert torch.equal(logits, before)
    with_pending = [h + [int(t)] for h, t in zip(histories, pending)]
    got = sample_ids(logits, _states(params), histories, positions=[len(h) for h in with_pending], pending=pending)
    assert got.tolist() == _penalised_first(logits, params, with_pending)
    assert torch.equal(logits, before)
    with torch.inference_mode():  # as the runner's logits come
        frozen = logits.clone()
    assert sample_ids(frozen, _states(params), histories).tolist() == want
    assert torch.equal(frozen, before)
    strided = torch.randn(4, 600, generator=gen)[:, ::2]  # not contiguous: penalised in a copy
    strided_before = strided.clone()
    assert sample_ids(strided, _states(params), histories).tolist() == _penalised_first(strided, params, histories)
    assert torch.equal(strided, strided_before)


def _states(params: list[SamplingParams]) -> list[SamplerState]:
    return [SamplerState(p) for p in params]


def _penalised_first(logits: torch.Tensor, params: list[SamplingParams], histories: list[list[int]]) -> list[int]:
    """The plain loop's penalties, then the same draws without penalties."""
    plain = [replace(p, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0) for p in params]
    after = _plain_penalties(logits, _states(params), histories)
    return sample_ids(after, _states(plain), histories).tolist()


def test_penalties_read_the_last_repeat_last_n_tokens_pending_included():
    from engine.sampling import penalise

    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(9)) * 3
    history = [3, 3, 5, 7, 9, 11, 3, 13]
    states = [SamplerState(SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5, repeat_last_n=n))
              for n in (-1, 0, 1, 3, 64)]
    histories = [history] * 5
    got = penalise(logits, states, histories)
    assert torch.allclose(got, _plain_penalties(logits, states, histories), atol=1e-6)
    assert torch.equal(got[1], logits[1])  # 0: off
    changed = [set(torch.nonzero(got[i] != logits[i]).flatten().tolist()) for i in range(5)]
    assert changed[2] == {13} and changed[3] == {3, 11, 13} and changed[0] == changed[4] == set(history)
    pending = torch.tensor([20, 20, 20, 20, 20])
    with_pending = [history + [20]] * 5
    assert torch.equal(penalise(logits, states, histories, pending), penalise(logits, states, with_pending))
    assert not penalised(SamplingParams(repetition_penalty=1.3, repeat_last_n=0))
    with pytest.raises(ParleyError, match="repeat_last_n"):
        SamplingParams(repeat_last_n=-2)


def test_counts_of_each_entry_in_its_row():
    from engine.sampling import _counts

    hist = torch.tensor([[5, 3, 5, 9, 5, 3], [7, 7, 7, 7, 1, 2], [4, 4, 4, 4, 4, 4]])
    want = [[h.count(x) for x in h] for h in hist.tolist()]
    assert _counts(hist).tolist() == want
    rows = torch.randint(0, 30, (5, 200), generator=torch.Generator().manual_seed(6))
    assert _counts(rows).tolist() == [[h.count(x) for x in h] for h in rows.tolist()]


def test_a_sequences_history_array_follows_its_tokens():
    from engine.sequence import Sequence

    seq = Sequence(0, [5, 6, 7], SamplerState(SamplingParams()))
    for t in (8, 9, 10):
        seq.append(t)
    seq.drop_last(2)
    assert seq.history().tolist() == seq.token_ids == [5, 6, 7, 8]
    seq.new_turn([1, 2])
    assert seq.history().tolist() == [1, 2]
    seq.token_ids.append(3)  # changed around the methods (a test, a future caller): rebuilt, not stale
    assert seq.history().tolist() == [1, 2, 3]
    seq.token_ids[-1] = 4
    assert seq.history().tolist() == [1, 2, 4]
