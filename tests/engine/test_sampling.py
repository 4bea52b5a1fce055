"""Sampler distributions: temperature, top-k, top-p, min-p and penalties, drawn many times."""
import pytest
import torch

from engine.errors import ParleyError
from engine.sampling import SamplerState, SamplingParams, sample_ids

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


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(min_p=1), dict(max_tokens=0), dict(top_k=-1)])
def test_invalid_params_are_clear_errors(bad):
    with pytest.raises(ParleyError, match="Invalid sampling setting"):
        SamplingParams(**bad)
