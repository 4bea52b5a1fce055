"""The GPU's draw (kernels/sampling_triton.py) against the plain fp64 definition of engine/sampling.py (on
a GPU when there is one, else interpreted), and against the torch path it replaces."""
import pytest
import torch

from kernels.sampling_triton import sample_rows_triton
from tests.support.sampling_reference import plain_top_draw

pytestmark = pytest.mark.gpu

# (top_k, temperature, top_p, min_p): top-k rows, open rows (nucleus among the first 256 or past them: a flat row at
# temperature 8), min-p alone, and no filter at all
CASES = [(40, 0.7, 0.95, 0.0), (5, 1.0, 1.0, 0.0), (200, 1.3, 0.9, 0.05), (64, 0.5, 0.5, 0.0), (1, 1.0, 1.0, 0.0),
         (50, 2.0, 0.3, 0.0), (0, 1.0, 0.9, 0.0), (0, 0.7, 1.0, 0.05), (0, 8.0, 0.9, 0.0), (0, 8.0, 1.0, 0.3),
         (0, 8.0, 0.5, 0.2), (0, 1.0, 1.0, 0.0), (0, 0.6, 1.0, 0.0)]
# a row's logits: three interpreted blocks of 512 (the last one partial), a flat row's nucleus past the first 256
# candidates (400-900 tokens at temperature 8), in about 60 % of the interpreter's time of 3,000
VOCAB = 1100


def _draw(rows: torch.Tensor, cases: list[tuple], u: list[float]) -> torch.Tensor:
    """Each kind of row drawn apart, as engine/sampling.py groups them: top-k rows with their k largest as candidates,
    open rows with their 256 largest, rows without filters with none."""
    out = torch.empty(len(cases), dtype=torch.long)
    kinds = [0 if c[0] else 1 if (c[2] < 1 or c[3] > 0) else 2 for c in cases]
    for kind in set(kinds):
        at = [i for i, k in enumerate(kinds) if k == kind]
        group = rows[at].contiguous()
        table = torch.tensor([[cases[i][1], cases[i][0], cases[i][2], cases[i][3], u[i]] for i in at],
                             dtype=torch.float64, device=rows.device)
        width = max(cases[i][0] for i in at) if kind == 0 else min(256, rows.shape[1]) if kind == 1 else 0
        candidates = group.topk(width, dim=-1, sorted=False) if width else None
        nucleus = any(cases[i][2] < 1 for i in at)  # the launches engine/sampling.py's whole_row lets it skip
        out[at] = sample_rows_triton(group, table, candidates, whole=kind > 0, nucleus=kind > 0 and nucleus).cpu()
    return out


def test_the_draw_equals_the_plain_definition(device):
    g = torch.Generator().manual_seed(5)
    checked = 0
    for trial in range(6):
        rows = torch.randn(len(CASES), VOCAB, generator=g) * 3
        if trial % 3 == 0:
            rows = rows.round()  # many equal logits: ties ranked and drawn by id
        u = torch.rand(len(CASES), generator=g, dtype=torch.float64).tolist()
        ids = _draw(rows.to(device), CASES, u)
        for r, (k, t, top_p, min_p) in enumerate(CASES):
            want, margin = plain_top_draw(rows[r], k, t, top_p, min_p, u[r])
            if margin > 1e-6:  # not at a boundary, where fp32 logits / t round either way
                assert int(ids[r]) == want, (trial, r, CASES[r])
                checked += 1
    assert checked > 50


def test_a_row_draws_the_same_alone_as_batched(device):
    g = torch.Generator().manual_seed(6)
    rows = (torch.randn(len(CASES), VOCAB, generator=g) * 3).to(device)
    u = torch.rand(len(CASES), generator=g, dtype=torch.float64).tolist()
    batched = _draw(rows, CASES, u)
    for r in range(len(CASES)):
        assert int(_draw(rows[r : r + 1], CASES[r : r + 1], u[r : r + 1])[0]) == int(batched[r]), CASES[r]


def test_the_ends_of_u_small_rows_and_masked_tokens(device):
    rows = torch.randn(4, 9, generator=torch.Generator().manual_seed(7))
    rows[:, 3] = float("-inf")  # a token of probability 0 is never drawn
    cases = [(0, 1.0, 0.9, 0.0), (0, 1.0, 1.0, 0.0), (3, 1.0, 1.0, 0.0), (0, 2.0, 1.0, 0.1)]
    for u in (0.0, 1 - 2**-53, 0.5):
        ids = _draw(rows.to(device), cases, [u] * 4)
        for r, case in enumerate(cases):
            assert int(ids[r]) != 3
            want, margin = plain_top_draw(rows[r], *case, u)
            assert margin <= 1e-6 or int(ids[r]) == want


def test_a_broken_row_still_gives_a_valid_id(device):
    rows = torch.randn(2, 500)
    rows[0, 7] = float("nan")
    rows[1] = float("-inf")
    ids = _draw(rows.to(device), [(0, 1.0, 0.9, 0.0), (0, 1.0, 1.0, 0.0)], [0.3, 0.3])
    assert ((ids >= 0) & (ids < 500)).all()
