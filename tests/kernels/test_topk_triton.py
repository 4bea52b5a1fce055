"""The draw's candidates (kernels/topk_triton.py): each row's k largest logits, ties by id, against the plain
definition (on a GPU when there is one, else interpreted)."""
import pytest
import torch

from kernels.topk_triton import topk_triton, torch_topk_reference

pytestmark = pytest.mark.gpu


def _rows(generator: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=generator) * 3
    x[0] = x[0].round()  # many equal logits: the k-th is tied, kept by id
    if rows > 2:
        x[2, : vocab // 2] = float("-inf")
        x[2, 5] = float("nan")  # ranked above +inf, as torch.topk does
        x[1, 7:40] = x[1].max()  # a run of ties at the top
    return x


@pytest.mark.parametrize("vocab,k", [(3000, 40), (3000, 1), (700, 700), (9, 3), (5000, 1024), (2049, 256)])
def test_the_candidates_are_the_k_largest_ties_by_id(device, vocab, k):
    x = _rows(torch.Generator().manual_seed(vocab + k), 3, vocab)
    values, ids = topk_triton(x.to(device), k)
    want_values, want_ids = torch_topk_reference(x, k)
    for r in range(3):
        assert sorted(ids[r].tolist()) == sorted(want_ids[r].tolist()), r
    assert torch.equal(x.gather(-1, ids.cpu()).nan_to_num(), values.cpu().nan_to_num())


def test_a_row_s_candidates_do_not_depend_on_what_shares_the_launch(device):
    x = _rows(torch.Generator().manual_seed(3), 4, 3000).to(device)
    batched = topk_triton(x, 64)[1].cpu()
    for r in range(4):
        assert sorted(topk_triton(x[r : r + 1].contiguous(), 64)[1][0].tolist()) == sorted(batched[r].tolist())
