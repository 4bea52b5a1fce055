"""A seeded draw is the same alone and batched whatever its neighbours ask for, on every draw path (the CPU library's
and torch's, which runs without the library: off x86-64, without a compiler)."""
import pytest
import torch

from engine.sampling import SamplerState, SamplingParams, sample_ids


@pytest.fixture(params=["library", "torch"])
def path(request, monkeypatch):
    if request.param == "torch":
        for name in ("draw_rows", "sample_top", "top_rows", "penalise_rows"):
            monkeypatch.setattr(f"engine.sampling.{name}", lambda *args: None)
    return request.param


def _coarse(vocab: int = 4096) -> torch.Tensor:
    """Logits on a coarse grid, as bf16 rounds them: many tokens tie at every rank."""
    return (torch.randn(1, vocab, generator=torch.Generator().manual_seed(0)) * 2).round() / 2


@pytest.mark.parametrize("target, neighbour", [
    (dict(top_k=5), dict(top_k=300)),  # the neighbour widens the step's top-k
    (dict(top_p=0.05), dict(top_p=0.999)),  # the neighbour's nucleus widens the ranking past the first 256
    (dict(top_k=3, top_p=0.5), dict(top_k=1000, min_p=0.01)),
])
def test_tied_logits_draw_the_same_alone_and_beside_a_wider_row(path, target, neighbour):
    """torch.topk breaks ties in no fixed order: a top-k row's token changed with the width its neighbour made the
    step rank (62 of 200 positions on the torch path)."""
    row = _coarse()
    mine = SamplerState(SamplingParams(temperature=1.0, seed=3, **target))
    other = SamplerState(SamplingParams(temperature=1.0, seed=4, **neighbour))
    for position in range(100):
        alone = int(sample_ids(row.clone(), [mine], [[]], positions=[position])[0])
        both = sample_ids(torch.cat([row, row]), [mine, other], [[], []], positions=[position, position])
        assert alone == int(both[0]), position


def test_tied_logits_keep_the_lowest_ids_as_the_library_does(path):
    """Equal logits rank by id: a top-k that cuts through a tie keeps the tie's lowest ids, on either path."""
    row = torch.zeros(1, 64)
    row[0, [40, 9, 33, 21]] = 1.0  # four tied at the top; top-k 2 keeps 9 and 21
    state = SamplerState(SamplingParams(temperature=1.0, top_k=2, seed=0))
    drawn = {int(sample_ids(row.clone(), [state], [[]], positions=[p])[0]) for p in range(200)}
    assert drawn == {9, 21}
