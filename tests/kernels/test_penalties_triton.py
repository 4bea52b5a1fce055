"""The GPU's one-launch penalties (kernels/penalties_triton.py) against engine/sampling.py's torch path: the same
penalised logits, and the originals put back."""
import pytest
import torch

from engine.sampling import SamplerState, SamplingParams, _counts, penalise
from kernels.penalties_triton import penalise_rows_triton, restore_rows_triton

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("frequency", [0.0, 0.4])
def test_penalised_rows_equal_the_torch_path_and_come_back(device, frequency):
    g = torch.Generator().manual_seed(3)
    vocab = 3000
    logits = torch.randn(5, vocab, generator=g) * 4
    params = [SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=frequency),
              SamplingParams(repetition_penalty=2.0),
              SamplingParams(presence_penalty=-0.7, frequency_penalty=frequency),
              SamplingParams(repetition_penalty=0.8)]
    # repeats, ids past the first chunk of 1024, an empty history padded throughout
    histories = [[int(t) for t in torch.randint(0, 60, (700,), generator=g)],
                 [int(t) for t in torch.randint(0, vocab, (2500,), generator=g)],
                 [5, 5, 5, 9],
                 []]
    rows = [0, 2, 3, 4]  # row 1 has no penalties
    states = [SamplerState(p) for p in params]
    unpenalised = [SamplerState(SamplingParams())]
    want = penalise(logits, states[:1] + unpenalised + states[1:], histories[:1] + [[]] + histories[1:])
    width = max(len(h) for h in histories)
    hist = torch.tensor([h + [vocab] * (width - len(h)) for h in histories])
    table = torch.tensor([[p.repetition_penalty, p.presence_penalty, p.frequency_penalty] for p in params])
    out = logits.to(device)
    hist_d = hist.to(device)
    counts = _counts(hist_d).float() if frequency else None
    original = penalise_rows_triton(out, torch.tensor(rows, device=device), hist_d, table.to(device), counts)
    assert torch.allclose(out.cpu(), want, atol=1e-6, rtol=1e-6)
    restore_rows_triton(out, torch.tensor(rows, device=device), hist_d, original)
    assert torch.equal(out.cpu(), logits)
