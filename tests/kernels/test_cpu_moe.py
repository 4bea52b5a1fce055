"""A mixture-of-experts layer in one library call (kernels/cpu/moe.c): near its PyTorch reference for each K-quant
pairing, with and without renormalised weights; every row exactly as alone (greedy batched == alone); a row's result
the chosen experts' products through the library, summed; bad shapes refused."""
from __future__ import annotations

import pytest
import torch

from kernels.cpu_act import gated_act
from kernels.cpu_kgemm import kgemm
from kernels.cpu_moe import ExpertBlocks, SharedExpert, moe
from kernels.cpu_native import cpu_kernel
from tests.kernels.test_cpu_kgemm import _blocks

pytestmark = pytest.mark.skipif(cpu_kernel() is None, reason="the CPU kernel does not build here")
D, I, E = 256, 512, 6


def _experts(gate_up_type: str, down_type: str, act: str = "silu", shared: SharedExpert | None = None) -> ExpertBlocks:
    return ExpertBlocks.of([_blocks(gate_up_type, 2 * I, D, seed=e) for e in range(E)], gate_up_type,
                           [_blocks(down_type, D, I, seed=100 + e) for e in range(E)], down_type, act, shared)


def _inputs(rows: int = 13) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(rows, D, generator=g), torch.randn(E, D, generator=g) * 0.2


@pytest.mark.parametrize("types", [("Q4_K", "Q6_K"), ("Q5_K", "Q4_K"), ("Q6_K", "Q5_K")])
@pytest.mark.parametrize("norm", [True, False])
def test_the_library_mixture_is_near_its_reference(types, norm):
    experts = _experts(*types, act="silu" if norm else "gelu_tanh")
    x, router = _inputs()
    got = moe(x, router, experts, 2, norm, impl="native")
    want = moe(x, router, experts, 2, norm, impl="reference")
    scale = want.abs().max()
    assert (got - want).abs().max() <= 2e-4 * scale, ((got - want).abs().max(), scale)
    alone = torch.cat([moe(x[i:i + 1], router, experts, 2, norm, impl="native") for i in range(len(x))])
    assert torch.equal(got, alone)  # a row never depends on the rows routed beside it


def test_a_shared_expert_adds_its_gated_output():
    """Qwen2-MoE's shared expert (its own width and types) in the same call: near the reference, rows alone, and the
    routed part unchanged by it (the difference is exactly the shared term, to the float rounding)."""
    shared = SharedExpert(_blocks("Q5_K", 4 * I, D, seed=50), "Q5_K", _blocks("Q6_K", D, 2 * I, seed=51), "Q6_K",
                          torch.randn(D, generator=torch.Generator().manual_seed(52)) * 0.1)
    with_shared, routed = _experts("Q4_K", "Q6_K", shared=shared), _experts("Q4_K", "Q6_K")
    x, router = _inputs()
    got = moe(x, router, with_shared, 2, False, impl="native")
    want = moe(x, router, with_shared, 2, False, impl="reference")
    assert (got - want).abs().max() <= 2e-4 * want.abs().max()
    assert torch.equal(got, torch.cat([moe(x[i:i + 1], router, with_shared, 2, False, impl="native")
                                       for i in range(len(x))]))
    term = got - moe(x, router, routed, 2, False, impl="native")
    gu = kgemm(x, shared.gate_up, "Q5_K", impl="native")
    act = gated_act(gu[:, :2 * I], gu[:, 2 * I:], "silu", impl="native")
    expect = torch.sigmoid(x @ shared.gate)[:, None] * kgemm(act, shared.down, "Q6_K", impl="native")
    assert (term - expect).abs().max() <= 1e-5 * got.abs().max()


def test_a_selection_bias_and_an_ungated_shared_expert():
    """ERNIE 4.5's routing: experts chosen by softmax + bias, weighted by the softmax alone, and a shared expert added
    without a gate; near the reference, rows alone, and the bias really changes the choice."""
    shared = SharedExpert(_blocks("Q4_K", 2 * I, D, seed=60), "Q4_K", _blocks("Q6_K", D, I, seed=61), "Q6_K")
    experts = _experts("Q4_K", "Q6_K", shared=shared)
    x, router = _inputs()
    bias = torch.linspace(-0.5, 0.5, E)
    got = moe(x, router, experts, 2, True, bias, impl="native")
    want = moe(x, router, experts, 2, True, bias, impl="reference")
    assert (got - want).abs().max() <= 2e-4 * want.abs().max()
    assert torch.equal(got, torch.cat([moe(x[i:i + 1], router, experts, 2, True, bias, impl="native")
                                       for i in range(len(x))]))
    assert (got - moe(x, router, experts, 2, True, impl="native")).abs().max() > 1e-2 * got.abs().max()
    # the weights stay the softmax's: a bias equal for every expert changes nothing
    assert torch.equal(moe(x, router, experts, 2, True, torch.full((E,), 0.25), impl="native"),
                       moe(x, router, experts, 2, True, torch.zeros(E), impl="native"))


def test_sigmoid_scores_scaled():
    """GLM-4.5's routing: each expert's sigmoid, the bias for the choice, renormalised and scaled by 2.5."""
    experts = _experts("Q4_K", "Q6_K")
    x, router = _inputs()
    bias = torch.linspace(0.3, -0.3, E)
    got = moe(x, router, experts, 2, True, bias, sigmoid=True, scaling=2.5, impl="native")
    want = moe(x, router, experts, 2, True, bias, sigmoid=True, scaling=2.5, impl="reference")
    assert (got - want).abs().max() <= 2e-4 * want.abs().max()
    unscaled = moe(x, router, experts, 2, True, bias, sigmoid=True, impl="native")
    # the scale goes into the weights before the sum: equal within the rounding of the row's largest terms (random
    # experts' outputs cancel: on an AVX2 CPU an output of 3e4 in a row whose largest is 4e7 moved by 0.48)
    assert ((got - 2.5 * unscaled).abs() <= 1e-6 * got.abs().amax(1, keepdim=True)).all()
    assert (unscaled - moe(x, router, experts, 2, True, bias, impl="native")).abs().max() > 1e-3 * got.abs().max()


def test_a_row_is_its_experts_library_products_summed():
    """The one call gives, per row, the library's own products of its chosen experts (the routing's weights aside:
    they are taken from torch's softmax here, so the sum is compared to the float rounding)."""
    experts = _experts("Q4_K", "Q6_K")
    x, router = _inputs(5)
    got = moe(x, router, experts, 3, True, impl="native")
    probs = torch.softmax(x @ router.t(), -1)
    top = probs.topk(3, -1)
    for r in range(len(x)):
        want = torch.zeros(D)
        for e, w in sorted(zip(top.indices[r].tolist(), (top.values[r] / top.values[r].sum()).tolist())):
            gu = kgemm(x[r:r + 1], experts.gate_up[e], "Q4_K", impl="native")
            act = gated_act(gu[:, :I], gu[:, I:], "silu", impl="native")
            want += w * kgemm(act, experts.down[e], "Q6_K", impl="native")[0]
        assert (got[r] - want).abs().max() <= 1e-5 * want.abs().max()


def test_every_expert_chosen_by_every_row_and_no_rows():
    experts = _experts("Q4_K", "Q4_K")
    x, router = _inputs(4)
    got = moe(x, router, experts, E, True, impl="native")
    torch.testing.assert_close(got, moe(x, router, experts, E, True, impl="reference"), atol=1e-3, rtol=2e-4)
    assert moe(x[:0], router, experts, 2, True, impl="native").shape == (0, D)


def test_bad_shapes_are_refused():
    experts = _experts("Q4_K", "Q6_K")
    x, router = _inputs(2)
    with pytest.raises(ValueError, match="do not fit"):
        moe(x, router, experts, E + 1, True, impl="native")
    with pytest.raises(ValueError, match="do not fit"):
        moe(x[:, :128], router, experts, 2, True, impl="native")
    with pytest.raises(ValueError, match="not the library's"):
        ExpertBlocks.of(list(experts.gate_up), "Q8_0", list(experts.down), "Q6_K", "silu")
    with pytest.raises(ValueError, match="same shapes"):
        ExpertBlocks.of(list(experts.gate_up), "Q4_K", list(experts.down[:-1]), "Q6_K", "silu")


def test_a_row_of_nans_stays_its_own():
    """A row gone bad (NaN, inf) routes somewhere and yields non-finite values without touching the other rows."""
    experts = _experts("Q4_K", "Q6_K")
    x, router = _inputs(4)
    good = moe(x, router, experts, 2, True, impl="native")
    x[1, 7], x[2, 3] = float("nan"), float("inf")
    got = moe(x, router, experts, 2, True, impl="native")
    assert torch.equal(got[[0, 3]], good[[0, 3]])
    assert not torch.isfinite(got[1]).all() and not torch.isfinite(got[2]).all()


def _code_experts(bits: int, lut: bool, act: str, biased: bool) -> "CodeExperts":
    """E experts in the codes layout (MXFP4's indices with its lut, or 8-bit codes with zero 128), random."""
    from engine.quant.weight import FP4_LUT
    from kernels.cpu_moe import CodeExperts

    g = torch.Generator().manual_seed(7)

    def matrix(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        codes = torch.randint(0, 256, (n, k * bits // 8), dtype=torch.uint8, generator=g)
        return codes, (torch.rand(n, k // 32, generator=g) * (0.004 if bits == 8 else 0.05) + 1e-3).half()

    gu, dn = [matrix(2 * I, D) for _ in range(E)], [matrix(D, I) for _ in range(E)]
    biases = (torch.randn(E, 2 * I, generator=g), torch.randn(E, D, generator=g)) if biased else (None, None)
    return CodeExperts.of(gu, dn, *biases, bits, 12 if lut else 128, FP4_LUT if lut else None, act, 1.702, 1.5)


@pytest.mark.parametrize("bits, lut, act, biased", [(4, True, "clamped", True), (8, False, "silu", False)],
                         ids=["mxfp4-gpt-oss", "q8-silu"])
def test_codes_layout_mixture_is_near_its_reference(bits, lut, act, biased):
    """gpt-oss's layer in one call (MXFP4 experts, router and experts' biases, the clamped activation at a limit low
    enough to bite), and a plain 8-bit one: near the reference, every row as alone, and the router bias really moves
    the choice."""
    from kernels.cpu_moe import moe_codes

    experts = _code_experts(bits, lut, act, biased)
    x, router = _inputs()
    rb = torch.linspace(-1.0, 1.0, E) if biased else None
    got = moe_codes(x, router, rb, experts, 2, True, impl="native")
    want = moe_codes(x, router, rb, experts, 2, True, impl="reference")
    assert (got - want).abs().max() <= 2e-4 * want.abs().max(), ((got - want).abs().max(), want.abs().max())
    alone = torch.cat([moe_codes(x[i:i + 1], router, rb, experts, 2, True, impl="native") for i in range(len(x))])
    assert torch.equal(got, alone)
    if biased:
        assert (got - moe_codes(x, router, None, experts, 2, True, impl="native")).abs().max() > 1e-2 * got.abs().max()
