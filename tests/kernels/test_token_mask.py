"""refuse_tokens (Triton, one launch for a step's guided rows) against the torch reference and the bits themselves."""

from __future__ import annotations

import pytest
import torch

from kernels import triton_available
from kernels.token_mask import refuse_tokens

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")
pytestmark = pytest.mark.gpu  # run on the GPU when there is one (`make test-gpu`)


def _case(rows: int, vocab: int, guided: list[int], dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    words = torch.randint(-(2**31), 2**31, (len(guided), (vocab + 31) // 32), generator=g, dtype=torch.int64)
    words = words.to(torch.int32)
    words[0, :] = 0  # a row that allows nothing
    if len(guided) > 1:
        words[1, :] = -1  # a row that allows everything
    return logits, torch.tensor(guided, dtype=torch.long), words


def _allowed(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bit v of row j, token by token: the plain definition the kernels must meet."""
    ids = torch.arange(vocab)
    return ((words.to(torch.int64)[:, ids // 32] >> (ids % 32)) & 1).bool()


@pytest.mark.parametrize("impl", ["reference", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,vocab,guided", [(4, 300, [0, 2, 3]), (3, 5000, [2, 0]), (2, 4097, [1])])
def test_refused_tokens_are_minus_inf_and_the_rest_untouched(impl, dtype, rows, vocab, guided):
    logits, index, words = _case(rows, vocab, guided, dtype, seed=rows * vocab)
    expected = logits.clone()
    allowed = _allowed(words, vocab)
    for j, r in enumerate(guided):
        expected[r][~allowed[j]] = float("-inf")
    out = logits.to(DEVICE)
    refuse_tokens(out, index.to(DEVICE), words.to(DEVICE), impl=impl)
    assert torch.equal(out.cpu(), expected)


@needs_triton
def test_triton_equals_the_reference_on_a_strided_view():
    """Logits as a slice of a wider buffer (a step's rows of the runner's output): the row stride is honoured."""
    base, index, words = _case(6, 700, [5, 1, 3], torch.float32, seed=7)
    wide = torch.zeros(6, 900)
    wide[:, :700] = base
    a, b = wide.clone().to(DEVICE), wide.clone().to(DEVICE)
    refuse_tokens(a[:, :700], index.to(DEVICE), words.to(DEVICE), impl="triton")
    refuse_tokens(b[:, :700], index.to(DEVICE), words.to(DEVICE), impl="reference")
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a[:, 700:].cpu(), torch.zeros(6, 200))
