"""The CPU library's row kernels around the products: the attention prologue (kernels/cpu/rope.c), the gated MLP
activation (act.c) and the greedy argmax (argmax.c), each against its torch reference, each row independent of the
others in its call."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.argmax import argmax_rows
from kernels.cpu_act import gated_act, gated_act_reference
from kernels.cpu_native import cpu_kernel
from kernels.cpu_rope import qk_rope_write, qk_rope_write_reference
from kernels.norms import rope_tables

pytestmark = pytest.mark.skipif(cpu_kernel() is None, reason="the CPU kernel does not build here")


def _rope_case(t: int, h: int, hkv: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g) * 3
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = rope_tables(torch.arange(5, 5 + t), inv, torch.float32)
    weights = torch.randn(d, generator=g), torch.randn(d, generator=g)
    slots = torch.randperm(40, generator=g)[:t]
    return qkv, cos, sin, weights, slots


def _caches(hkv: int, d: int):
    return torch.zeros(20, 2, hkv, d), torch.zeros(20, 2, hkv, d)  # a sequence layout's (rows, columns, Hkv, D)


@pytest.mark.parametrize("h, hkv, d, normed", [(4, 1, 256, True), (8, 2, 64, False), (2, 2, 20, True)])
def test_prologue_matches_reference_and_writes_the_cache(h, hkv, d, normed):
    qkv, cos, sin, (qw, kw), slots = _rope_case(5, h, hkv, d)
    q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)  # views of one fused product
    weights = (qw, kw) if normed else (None, None)
    kc, vc = _caches(hkv, d)
    rk, rv = _caches(hkv, d)
    got = qk_rope_write(q, k, v, *weights, 1e-6, cos, sin, slots, kc, vc, impl="native")
    want = qk_rope_write_reference(q, k, v, *weights, 1e-6, cos, sin, slots, rk, rv)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kc, rk, atol=1e-5, rtol=1e-5)
    assert torch.equal(vc, rv)  # v is copied as it is
    assert kc.reshape(-1, hkv, d).abs().sum((1, 2)).nonzero().flatten().sort().values.tolist() == \
        slots.sort().values.tolist()  # only the rows at `slots` were written
    for i in range(5):  # each row alone, from three separate products this time
        kc1, vc1 = _caches(hkv, d)
        alone = qk_rope_write(q[i:i + 1].clone(), k[i:i + 1].clone(), v[i:i + 1].clone(), *weights, 1e-6,
                              cos[i:i + 1], sin[i:i + 1], slots[i:i + 1], kc1, vc1, impl="native")
        assert torch.equal(alone[0], got[i])
        assert torch.equal(kc1.reshape(-1, hkv, d)[slots[i]], kc.reshape(-1, hkv, d)[slots[i]])


@pytest.mark.parametrize("h, hkv, d, normed", [(4, 1, 256, True), (8, 2, 64, False), (2, 2, 20, True)])
def test_prologue_writes_an_fp16_cache_as_the_fp32_values_rounded(h, hkv, d, normed):
    qkv, cos, sin, (qw, kw), slots = _rope_case(5, h, hkv, d)
    q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
    weights = (qw, kw) if normed else (None, None)
    kc, vc = _caches(hkv, d)
    k16, v16 = (c.half() for c in _caches(hkv, d))
    want = qk_rope_write(q, k, v, *weights, 1e-6, cos, sin, slots, kc, vc, impl="native")
    got = qk_rope_write(q, k, v, *weights, 1e-6, cos, sin, slots, k16, v16, impl="native")
    assert torch.equal(got, want)  # q is the same
    assert torch.equal(k16, kc.half()) and torch.equal(v16, vc.half())  # rounded to nearest, as .half() rounds


def test_prologue_refuses_what_it_cannot_take():
    qkv, cos, sin, _, slots = _rope_case(2, 2, 1, 16)
    q, k, v = qkv.split([32, 16, 16], dim=-1)
    kc, vc = _caches(1, 16)
    with pytest.raises(ValueError, match="fp32"):
        qk_rope_write(q, k, v, None, None, 1e-6, cos, sin, slots, kc.bfloat16(), vc, impl="native")
    with pytest.raises(ValueError, match="fp16"):  # both caches of one type
        qk_rope_write(q, k, v, None, None, 1e-6, cos, sin, slots, kc.half(), vc, impl="native")
    with pytest.raises(ValueError, match="one stride"):
        qk_rope_write(q, k.clone(), v, None, None, 1e-6, cos, sin, slots, kc, vc, impl="native")


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("width", [2048, 19])
def test_gated_act_matches_torch(act, width):
    g = torch.Generator().manual_seed(width)
    x = torch.randn(6, 2 * width, generator=g) * 4
    x[0, :8] = torch.tensor([0.0, -0.0, 30.0, -30.0, 90.0, -90.0, 1e-8, -1e-8])  # the exp's clamps and tiny values
    gate, up = x.chunk(2, dim=-1)
    got = gated_act(gate, up, act, impl="native")
    torch.testing.assert_close(got, gated_act_reference(gate, up, act), atol=1e-5, rtol=2e-6)
    assert torch.equal(gated_act(gate[3:4], up[3:4], act, impl="native")[0], got[3])  # a row alone
    two = gated_act(gate.contiguous(), up.contiguous(), act, impl="native")  # two products instead of one
    assert torch.equal(two, got)


def test_gated_act_matches_the_models_activation():
    x = torch.linspace(-12, 12, 4096).reshape(2, 2048)
    want = F.gelu(x[:, :1024], approximate="tanh") * x[:, 1024:]
    torch.testing.assert_close(gated_act(x[:, :1024], x[:, 1024:], "gelu_tanh", impl="native"), want,
                               atol=1e-5, rtol=2e-6)


@pytest.mark.parametrize("rows, width", [(1, 262144), (3, 2048), (2, 13), (1, 7)])
def test_argmax_matches_torch(rows, width):
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(width)) * 4
    assert torch.equal(argmax_rows(x, impl="auto"), x.argmax(-1))


def test_argmax_ties_nan_and_infinities_as_torch():
    x = torch.full((5, 1003), -3.0)
    x[0, [900, 17, 999]] = 2.5  # ties: the first index, whichever lane holds it
    x[1, [8, 9]] = 1.0
    x[2] = float("-inf")
    x[3, [40, 700]] = float("nan")  # a NaN is the maximum: the first one
    x[3, 5] = float("inf")
    x[4, 1001] = float("nan")  # a NaN in the scalar tail
    assert torch.equal(argmax_rows(x, impl="auto"), x.argmax(-1))
