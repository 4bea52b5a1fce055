"""engine/sampling_graphs.py: a step's penalties and draw from one staged copy (and, on a GPU, a replayed graph) give
the tokens of the launch-by-launch path (`sampling.sample_ids` on a GPU: penalties, argmax, each group's
`_gpu_draw`), leave the logits as they came, and decline the steps past them. Interpreted on the CPU (no capture
there), captured on a GPU."""
from array import array

import pytest
import torch

from engine import sampling, sampling_graphs
from engine.sampling import SamplerState, SamplingParams, sample_ids
from engine.sampling_graphs import SamplingGraphs

pytestmark = pytest.mark.gpu

VOCAB = 3000
# the step-by-step comparison's rows: still three interpreted blocks of 512 (the last one partial) and a flat row's
# nucleus past the first 256 candidates, in about half the interpreter's time of 3,000
STEP_VOCAB = 1100
APP = dict(temperature=0.7, top_k=40, top_p=0.95, repetition_penalty=1.1, repeat_last_n=64)
SETTINGS = {
    "app": [APP] * 3,
    "frequency": [dict(temperature=1.0, top_k=50, presence_penalty=0.5, frequency_penalty=0.7, repeat_last_n=-1),
                  dict(temperature=0.8, top_k=20), dict(temperature=1.2, top_k=5, repetition_penalty=1.3)],
    "open": [dict(temperature=0.8, top_p=0.9), dict(temperature=1.0, min_p=0.05, repetition_penalty=1.2),
             dict(temperature=6.0, top_p=0.5)],  # a flat row: its nucleus lies past the first candidates
    "whole_row": [dict(temperature=1.0), dict(temperature=0.6, repetition_penalty=1.5, repeat_last_n=8)],
    # side by side: greedy rows (one penalised) beside rows of each kind
    "mixed": [APP, {}, dict(temperature=0.8, top_p=0.9), dict(repetition_penalty=1.3), dict(temperature=1.0)],
    "compare": [{}, dict(temperature=0.7, top_k=40)],  # no penalties: the greedy row takes the step's argmax
}


def _stepwise(logits, states, histories, positions, pending, argmax=None):
    """The launch-by-launch path the graph replaces, on the same kernels: `sample_ids` as it runs on a GPU."""
    drawing = [i for i, s in enumerate(states) if not s.params.greedy]
    with sampling._penalties(logits, states, histories, pending) as (penalised, changed):
        ids = (argmax if argmax is not None and not changed else sampling._argmax(penalised)).clone()
        for group in sampling._groups([states[i] for i in drawing]):
            rows = [drawing[j] for j in group]
            ids[rows] = sampling._gpu_draw(penalised[rows].contiguous(), [states[i] for i in rows],
                                           [positions[i] for i in rows])
        return ids


def _histories(g: torch.Generator, rows: int, length: int, vocab: int = VOCAB) -> list[array]:
    # ids repeat (a frequency penalty counts them) and reach past the first chunks of the vocabulary
    return [array("q", torch.randint(0, vocab, (length + 7 * r,), generator=g).tolist()) for r in range(rows)]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("ahead", [False, True])
def test_graph_draws_equal_the_launch_by_launch_path(device, setting, ahead):
    g = torch.Generator().manual_seed(len(setting) + ahead)
    graphs = SamplingGraphs(device)
    states = [SamplerState(SamplingParams(seed=i, **p)) for i, p in enumerate(SETTINGS[setting])]
    logits = torch.empty(len(states), STEP_VOCAB, device=device)  # one buffer, as a decode graph's: the key repeats
    histories = _histories(g, len(states), 30, STEP_VOCAB)
    for step in range(4):
        logits.copy_(torch.randn(len(states), STEP_VOCAB, generator=g) * 3)
        if step == 1:
            logits[:, : STEP_VOCAB // 2] = logits[:, : STEP_VOCAB // 2].round()  # ties ranked by id
        before = logits.clone()
        pending = torch.randint(0, STEP_VOCAB, (len(states),), generator=g).to(device) if ahead else None
        positions = [len(h) + ahead for h in histories]
        argmax = torch.full((len(states),), 7, device=device)  # a step's own argmax, used as given where it stands
        want = _stepwise(logits, states, histories, positions, pending, argmax).cpu()
        got = graphs.sample(logits, states, histories, positions, pending, argmax)
        assert got is not None
        assert got.cpu().tolist() == want.tolist(), (setting, step)
        assert torch.equal(logits, before)  # the penalties taken back, bit for bit
        for h, t in zip(histories, got.cpu().tolist()):
            h.append(t)
    if device.type == "cuda":  # drawn eagerly once, captured once, then replayed
        assert graphs.captures == 1 and graphs.replays == 3


def test_sample_ids_uses_the_graphs_where_every_row_draws(device):
    g = torch.Generator().manual_seed(3)
    graphs = SamplingGraphs(device)
    states = [SamplerState(SamplingParams(seed=i, **APP)) for i in range(4)]
    logits = (torch.randn(4, VOCAB, generator=g) * 3).to(device)
    histories = _histories(g, 4, 70)  # longer than the penalty's window
    want = _stepwise(logits, states, histories, [len(h) for h in histories], None)
    got = sample_ids(logits, states, histories, graphs=graphs)
    assert got.cpu().tolist() == want.cpu().tolist()
    assert not got.is_inference()  # the caller may write it


def test_steps_past_the_graphs_are_declined(device):
    graphs = SamplingGraphs(device)
    logits = torch.randn(2, VOCAB, device=device)
    states = lambda *ps: [SamplerState(SamplingParams(seed=1, **p)) for p in ps]  # noqa: E731
    histories = [array("q", [1, 2, 3])] * 2
    assert graphs.sample(logits, states(dict(temperature=1.0, top_k=2000), APP), histories, [3, 3], None) is None
    assert graphs.sample(logits.t().contiguous().t(), states(APP, APP), histories, [3, 3], None) is None
    whole = dict(APP, repeat_last_n=-1)
    long = [array("q", range(5000))] * 2  # a penalised history past MAX_HISTORY
    assert graphs.sample(logits, states(whole, whole), long, [5000, 5000], None) is None
    assert graphs.sample(logits, states({}, {}), histories, [3, 3], None) is None  # nothing drawn
    # sample_ids then draws launch by launch
    ids = sample_ids(logits, states(whole, {}), long, graphs=graphs)
    assert int(ids[1]) == int(sampling.penalise(logits, states(whole, {}), long)[1].argmax())


def test_a_row_draws_the_same_alone_and_batched(device):
    g = torch.Generator().manual_seed(9)
    params = [APP, dict(APP, temperature=1.1), dict(APP, top_k=7)]
    logits = (torch.randn(3, VOCAB, generator=g) * 2).to(device)
    histories = _histories(g, 3, 40)
    positions = [len(h) for h in histories]
    states = [SamplerState(SamplingParams(seed=i, **p)) for i, p in enumerate(params)]
    batched = SamplingGraphs(device).sample(logits, states, histories, positions, None).cpu().tolist()
    for r in range(3):
        alone = SamplingGraphs(device).sample(logits[r : r + 1].contiguous(), states[r : r + 1], histories[r : r + 1],
                                              positions[r : r + 1], None)
        assert int(alone[0]) == batched[r]


@pytest.mark.parametrize("ahead", [False, True])
def test_penalties_count_each_seen_id_and_the_pending_token(device, ahead):
    """Logits where each penalty decides the token (temperature 0.05: the largest penalised logit): A seen twice,
    B once, D the pending token (or the history's last), C unseen. Frequency 2.5 per sighting: A 10 -> 5, B 9 -> 6.5,
    D 9 -> 6.5, C stays 7, the token. A presence penalty in its place would leave A at 7.5; D not counted, at 9."""
    a, b, c, d = 11, 1500, 2999, 700
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, [a, b, c, d]] = torch.tensor([10.0, 9.0, 7.0, 9.0])
    logits = logits.to(device)
    history = array("q", [a, 3, b, a] + ([] if ahead else [d]))
    pending = torch.tensor([d], device=device) if ahead else None
    state = SamplerState(SamplingParams(seed=1, temperature=0.05, top_k=4, frequency_penalty=2.5, repeat_last_n=-1))
    got = SamplingGraphs(device).sample(logits, [state], [history], [len(history) + ahead], pending)
    assert got.cpu().tolist() == [c]


def test_uniforms_in_lanes_equal_the_samplers_own():
    g = torch.Generator().manual_seed(5)
    states = [SamplerState(SamplingParams(seed=s)) for s in (0, 1, 2**64 - 1, 2**63, 12345678901234567)]
    states += [SamplerState(SamplingParams()) for _ in range(20)]  # fresh random keys
    positions = [0, 1, 2**31 - 1, 7, 2**40] + torch.randint(0, 2**20, (20,), generator=g).tolist()
    assert len(states) >= sampling_graphs.LANES_FROM
    assert sampling_graphs._uniforms_array(states, positions).tolist() == sampling._uniforms(states, positions)


def test_a_setting_changed_between_steps_draws_by_the_new_one(device):
    """The graphs keep what the rows' parameters decide from step to step; a row whose setting changes (a new
    parameters object, as the app's settings give) or whose history was empty is planned afresh."""
    g = torch.Generator().manual_seed(11)
    graphs = SamplingGraphs(device)
    states = [SamplerState(SamplingParams(seed=i, **p)) for i, p in enumerate([APP, dict(temperature=0.9, top_p=0.8)])]
    logits = torch.empty(2, VOCAB, device=device)
    histories = [array("q"), array("q", [5, 6, 7])]  # the first row has nothing to penalise yet
    changes = {2: (0, dict(temperature=1.3, top_k=3, frequency_penalty=1.0)), 3: (1, {}), 4: (1, APP)}
    for step in range(6):
        if step in changes:
            row, params = changes[step]
            states[row].update(SamplingParams(seed=row, **params))
        logits.copy_(torch.randn(2, VOCAB, generator=g) * 3)
        positions = [len(h) for h in histories]
        want = _stepwise(logits, states, histories, positions, None).cpu().tolist()
        got = graphs.sample(logits, states, histories, positions, None)
        assert got is not None and got.cpu().tolist() == want, step
        for h, t in zip(histories, want):
            h.append(t)
