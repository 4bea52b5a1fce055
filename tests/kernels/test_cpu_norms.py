"""RMSNorm and the residual add + norms in the CPU library (kernels/cpu/norms.c) against the model's torch RMSNorm."""
from __future__ import annotations

import pytest
import torch

from engine.models.layers import RMSNorm, add_and_norm
from kernels.cpu_native import cpu_kernel
from kernels.cpu_norms import add_norm, rms_norm

pytestmark = pytest.mark.skipif(cpu_kernel() is None, reason="the CPU kernel does not build here")


def _norm(d: int, seed: int) -> RMSNorm:
    n = RMSNorm(d, 1e-6, gemma=True)
    n.weight.data = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return n


@pytest.mark.parametrize("d", [640, 20])
def test_rms_norm_matches_torch_and_rows_are_independent(d):
    x = torch.randn(5, 3, d) * 4
    norm = _norm(d, 0)
    got = rms_norm(x, norm.weight, norm.eps)
    torch.testing.assert_close(got, norm(x), atol=1e-5, rtol=1e-5)
    assert torch.equal(rms_norm(x[2:3], norm.weight, norm.eps), got[2:3])


@pytest.mark.parametrize("with_pre, with_norm", [(True, True), (False, True), (True, False)])
def test_add_norm_matches_the_block_step(with_pre, with_norm):
    d = 64
    h, delta = torch.randn(4, d), torch.randn(4, d) * 3
    pre, norm = _norm(d, 1) if with_pre else None, _norm(d, 2) if with_norm else None
    want_h, want_x = add_and_norm(h, delta, norm, pre=pre)  # the torch path (native is off on these modules)
    got_h, got_x = add_norm(h, delta, pre.weight if pre else None, norm.weight if norm else None, 1e-6)
    torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
    if with_norm:
        torch.testing.assert_close(got_x, want_x, atol=1e-5, rtol=1e-5)
    else:
        assert got_x is None and want_x is None
