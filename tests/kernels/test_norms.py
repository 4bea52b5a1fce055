"""The fused per-token kernels (add_norm, norm_rope, qkv_rope_write, act_mul, embed_norm) against their PyTorch references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import triton_available
from kernels.norms import (act_mul, add_norm, embed_norm, norm_rope, qkv_rope_write, rms_norm_reference,
                           sum_partials)

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
DTYPES = [torch.float32, torch.bfloat16]
needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")
pytestmark = pytest.mark.gpu  # run on the GPU when there is one (`make test-gpu`)


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5  # bf16: one rounding apart at most, relative to the scale
    assert (a.float() - b.float()).abs().max() <= tol * max(1.0, float(b.float().abs().max()))


def _randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [True, False])
@pytest.mark.parametrize("parts", ["norm", "res+norm", "pre+res+norm", "pre+res"])
@pytest.mark.parametrize("D", [64, 80])
def test_add_norm(dtype, gemma, parts, D):
    x, h = _randn(5, D, dtype=dtype, seed=1), _randn(5, D, dtype=dtype, seed=2)
    w = (1 + 0.1 * _randn(D, dtype=torch.float32, seed=3)).to(dtype if not gemma else torch.float32)
    kw = dict(residual=h if "res" in parts else None, pre_weight=w.flip(0) if "pre" in parts else None)
    weight = w if parts.endswith("norm") else None
    got = add_norm(x, weight, 1e-6, gemma, impl="triton", **kw)
    ref = add_norm(x, weight, 1e-6, gemma, impl="reference", **kw)
    for g, r in zip(got, ref):
        assert (g is None) == (r is None)
        if g is not None:
            _close(g, r, dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [True, False])
@pytest.mark.parametrize("pre", [True, False])
@pytest.mark.parametrize("splits", [1, 3])
def test_add_norm_sums_split_k_partials(dtype, gemma, pre, splits):
    """A split-K GEMM's fp32 partials in place of its output: summed in order, rounded, then as before."""
    D = 80
    parts, h = _randn(splits, 5, D, dtype=torch.float32, seed=4), _randn(5, D, dtype=dtype, seed=5)
    w = (1 + 0.1 * _randn(D, dtype=torch.float32, seed=6)).to(dtype if not gemma else torch.float32)
    kw = dict(residual=h, pre_weight=w.flip(0) if pre else None)
    got = add_norm(parts, w, 1e-6, gemma, impl="triton", **kw)
    ref = add_norm(parts, w, 1e-6, gemma, impl="reference", **kw)
    whole = add_norm(parts.sum(0).to(dtype), w, 1e-6, gemma, impl="reference", **kw)
    for g, r, r2 in zip(got, ref, whole):
        assert g.shape == (5, D) and g.dtype == dtype
        _close(g, r, dtype)
        _close(g, r2, dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [None, "gemma", "plain"])
@pytest.mark.parametrize("D", [32, 80])
def test_norm_rope_on_strided_heads(dtype, norm, D):
    T, H, Hkv = 3, 4, 2
    fused = _randn(T, (H + 2 * Hkv) * D, dtype=dtype, seed=4)
    q = fused[:, : H * D].view(T, H, D)  # a strided view, as split from a fused QKV output
    pos = torch.tensor([0, 5, 17], device=DEVICE).float()
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEVICE).float() / D))
    freqs = torch.cat([pos[:, None] * inv[None, :]] * 2, dim=-1)[:, None, :]
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    w = None if norm is None else (1 + 0.1 * _randn(D, dtype=torch.float32, seed=5)).to(
        torch.float32 if norm == "gemma" else dtype)
    got = norm_rope(q, w, 1e-6, norm == "gemma", cos, sin, impl="triton")
    ref = norm_rope(q, w, 1e-6, norm == "gemma", cos, sin, impl="reference")
    _close(got, ref, dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [None, "gemma", "plain"])
@pytest.mark.parametrize("heads", [(4, 1), (4, 2), (2, 2)])
def test_qkv_rope_write_matches_norm_rope_and_kv_write(dtype, norm, heads):
    """q comes back normed and rotated; k (normed, rotated) and v land at their slots; nothing else moves."""
    H, Hkv = heads
    T, D, rows, C = 3, 32, 8, 4
    qkv = _randn(T, (H + 2 * Hkv) * D, dtype=dtype, seed=11)
    positions = torch.tensor([0, 5, 3000], device=DEVICE)  # a large angle too: the kernel's own cos/sin
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEVICE).float() / D))
    wdt = torch.float32 if norm == "gemma" else dtype
    qw = None if norm is None else (1 + 0.1 * _randn(D, dtype=torch.float32, seed=12)).to(wdt)
    kw = None if norm is None else (1 + 0.1 * _randn(D, dtype=torch.float32, seed=13)).to(wdt)
    slots = torch.tensor([9, 2, 30], dtype=torch.int64, device=DEVICE)  # scattered rows and columns
    caches = {}
    for impl in ("triton", "reference"):
        k_cache = _randn(rows, C, Hkv, D, dtype=dtype, seed=14)
        v_cache = _randn(rows, C, Hkv, D, dtype=dtype, seed=15)
        q = qkv_rope_write(qkv, H, Hkv, qw, kw, 1e-6, norm == "gemma", positions, inv_freq, k_cache, v_cache, slots,
                           impl=impl)
        caches[impl] = (q, k_cache, v_cache)
    for got, ref in zip(caches["triton"], caches["reference"]):
        _close(got, ref, dtype)
    untouched = torch.ones(rows * C, dtype=torch.bool)
    untouched[slots.cpu()] = False
    k_flat = caches["triton"][1].view(rows * C, Hkv, D)[untouched.to(DEVICE)]
    assert torch.equal(k_flat, _randn(rows, C, Hkv, D, dtype=dtype, seed=14).view(rows * C, Hkv, D)[untouched.to(DEVICE)])


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [True, False])
@pytest.mark.parametrize("scale", [None, 640**0.5])
def test_embed_norm(dtype, gemma, scale):
    """Rows gathered (repeats too), scaled as `h * tensor(scale, dtype)` is, then the first input norm."""
    V, D = 50, 80
    table = _randn(V, D, dtype=dtype, seed=31)
    tokens = torch.tensor([3, 49, 0, 3], device=DEVICE)
    h_bad, _ = embed_norm(torch.tensor([50, -1, 3], device=DEVICE), table, scale, torch.ones(D, device=DEVICE),
                          1e-6, gemma, impl="triton")  # ids past the table: zero rows, no stray read
    assert h_bad[:2].eq(0).all() and h_bad[2].abs().sum() > 0
    w = (1 + 0.1 * _randn(D, dtype=torch.float32, seed=32)).to(dtype if not gemma else torch.float32)
    h, x = embed_norm(tokens, table, scale, w, 1e-6, gemma, impl="triton")
    plain = F.embedding(tokens, table)
    if scale is not None:
        plain = plain * torch.tensor(scale, dtype=dtype)
    if ON_GPU or dtype == torch.float32:  # a gather and one rounded product: exact (the interpreter's bf16 casts truncate)
        assert torch.equal(h, plain)
    _close(h, plain, dtype)
    _close(x, rms_norm_reference(plain, w, 1e-6, gemma), dtype)
    for got, ref in zip((h, x), embed_norm(tokens, table, scale, w, 1e-6, gemma, impl="reference")):
        _close(got, ref, dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [None, 640**0.5])
def test_embed_norm_of_int8_rows(dtype, scale):
    """A quantized embedding's int8 rows: code * the row's scale in fp32, rounded to the model's dtype (as
    QuantEmbedding gives them), then scaled and normed as dense rows are; ids past the table read zeros."""
    from engine.models.layers import QuantEmbedding
    from engine.quant.weight import QuantTensor

    V, D = 50, 80
    g = torch.Generator().manual_seed(33)
    codes = torch.randint(-127, 128, (V, D), generator=g, dtype=torch.int8).to(DEVICE)
    row_scale = torch.empty(V).uniform_(0.001, 0.01, generator=g).bfloat16().to(DEVICE)
    tokens = torch.tensor([3, 49, 0, 3], device=DEVICE)
    w = (1 + 0.1 * _randn(D, dtype=torch.float32, seed=34)).to(torch.float32)
    h, x = embed_norm(tokens, codes, scale, w, 1e-6, True, row_scale=row_scale, dtype=dtype, impl="triton")
    rows = QuantEmbedding(QuantTensor("int8", (V, D), "Q8_0", codes=codes, scale=row_scale), dtype)(tokens)
    if scale is not None:
        rows = rows * torch.tensor(scale, dtype=dtype)
    assert h.dtype == dtype
    if ON_GPU or dtype == torch.float32:
        assert torch.equal(h, rows)
    _close(x, rms_norm_reference(rows, w, 1e-6, True), dtype)
    for got, ref in zip((h, x), embed_norm(tokens, codes, scale, w, 1e-6, True, row_scale=row_scale, dtype=dtype,
                                           impl="reference")):
        _close(got, ref, dtype)
    h_bad, _ = embed_norm(torch.tensor([50, -1], device=DEVICE), codes, scale, w, 1e-6, True, row_scale=row_scale,
                          dtype=dtype, impl="triton")
    assert h_bad.eq(0).all()


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v,d", [(50, 96), (64, 320)])  # rows one by one; tiles of 16 rows, three chunks
def test_embed_norm_of_int4_rows(dtype, v, d):
    """A quantized embedding's int4 rows (the CUDA words and pairs, either layout): (code - 8) * scale + zero in fp32,
    rounded to the model's dtype exactly as QuantEmbedding gives them, then scaled and normed; ids past the table
    read zeros."""
    import numpy as np

    from engine.models.layers import QuantEmbedding
    from engine.quant.gguf_blocks import Int4Groups
    from engine.quant.weight import pack_int4

    rng = np.random.default_rng(v + d)
    groups = Int4Groups(rng.integers(0, 16, (v, d), dtype=np.uint8),
                        rng.uniform(0.001, 0.02, (v, d // 32)).astype(np.float32),
                        rng.normal(0, 0.02, (v, d // 32)).astype(np.float32))
    q = pack_int4(groups, "Q4_K", device="cuda")  # the GPU layout, built on the CPU
    assert q.words.dim() == (4 if v % 16 == 0 else 2)
    q.words, q.pairs = q.words.to(DEVICE), q.pairs.to(DEVICE)
    tokens = torch.tensor([3, v - 1, 0, 3, 17], device=DEVICE)
    w = (1 + 0.1 * _randn(d, dtype=torch.float32, seed=35)).to(torch.float32)
    scale = d**0.5
    h, x = embed_norm(tokens, q.words, scale, w, 1e-6, True, int4_pairs=q.pairs, dtype=dtype, impl="triton")
    rows = QuantEmbedding(q, dtype)(tokens) * torch.tensor(scale, dtype=dtype)
    assert h.shape == (5, d) and h.dtype == dtype
    if ON_GPU or dtype == torch.float32:
        assert torch.equal(h, rows)
    _close(x, rms_norm_reference(rows, w, 1e-6, True), dtype)
    for got, ref in zip((h, x), embed_norm(tokens, q.words, scale, w, 1e-6, True, int4_pairs=q.pairs, dtype=dtype,
                                           impl="reference")):
        _close(got, ref, dtype)
    h_bad, _ = embed_norm(torch.tensor([v, -1], device=DEVICE), q.words, scale, w, 1e-6, True, int4_pairs=q.pairs,
                          dtype=dtype, impl="triton")
    assert h_bad.eq(0).all()


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_qkv_rope_write_sums_split_k_partials(dtype, splits):
    """The QKV GEMM's fp32 partials in place of its output: the same q and cache writes as their rounded sum."""
    H, Hkv, T, D, rows, C = 4, 2, 3, 32, 8, 4
    parts = _randn(splits, T, (H + 2 * Hkv) * D, dtype=torch.float32, seed=21)
    positions = torch.tensor([1, 7, 300], device=DEVICE)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEVICE).float() / D))
    w = (1 + 0.1 * _randn(D, dtype=torch.float32, seed=22))
    slots = torch.tensor([9, 2, 30], dtype=torch.int64, device=DEVICE)
    out = {}
    for name, qkv, impl in (("parts", parts, "triton"), ("whole", parts.sum(0).to(dtype), "reference")):
        k_cache = torch.zeros(rows, C, Hkv, D, dtype=dtype, device=DEVICE)
        v_cache = torch.zeros_like(k_cache)
        q = qkv_rope_write(qkv, H, Hkv, w, w.flip(0), 1e-6, True, positions, inv_freq, k_cache, v_cache, slots,
                           dtype=dtype, impl=impl)
        out[name] = (q, k_cache, v_cache)
    assert out["parts"][0].dtype == dtype
    for got, ref in zip(out["parts"], out["whole"]):
        _close(got, ref, dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("inter", [48, 1100])
def test_act_mul(dtype, act, inter):
    x = _randn(3, 2 * inter, dtype=dtype, seed=6) * 3
    _close(act_mul(x, act, impl="triton"), act_mul(x, act, impl="reference"), dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [2, 3])
def test_act_mul_sums_split_k_partials(dtype, splits):
    """A quantized gate/up GEMM's fp32 partials (S, T, 2I), summed in order and rounded as the whole product is."""
    parts = _randn(splits, 4, 2 * 96, dtype=torch.float32, seed=8) * 2
    got = act_mul(parts, "silu", dtype=dtype, impl="triton")
    assert got.shape == (4, 96) and got.dtype == dtype
    _close(got, act_mul(sum_partials(parts, dtype), "silu", impl="triton"), dtype)
    _close(got, act_mul(parts, "silu", dtype=dtype, impl="reference"), dtype)


@pytest.fixture(scope="module")
def module_logits() -> dict:
    """The module-by-module path's logits by (arch, attention): the same with or without the decode GEMMs, so each
    is computed once (interpreted attention: half of a gemma3 case's time)."""
    return {}


@needs_triton
@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen3"])
@pytest.mark.parametrize("attention", ["auto", "triton"])
@pytest.mark.parametrize("gemm", [False, True])
def test_model_with_fused_kernels_matches_modules(arch, attention, gemm, tiny_models, monkeypatch, device,
                                                  module_logits):
    """Whole forwards with the kernels chosen (forced on here on CPU) equal the module-by-module path; with
    the attention kernels the K/V write is fused into the q/k norm + rope launch (direct_write); with the
    decode GEMMs the MLP's activation runs in the gate/up GEMM's epilogue."""
    import engine.models.layers as layers
    from engine.cache import CacheConfig, make_cache
    from engine.loading.loader import LoadOptions, load_model
    from engine.models.kernel_choice import KernelChoice
    from engine.step_inputs import StepInputs

    lm = load_model(tiny_models[arch].gguf_path, LoadOptions(weights="dequantized"))  # the fused kernels are float-only
    model, args = lm.model.to(device), lm.args
    tokens = torch.randint(5, args.vocab_size, (12,), generator=torch.Generator().manual_seed(0)).to(device)
    positions = torch.arange(12, device=device)

    def logits(choice: KernelChoice) -> torch.Tensor:
        model.prepare(choice)
        cfg = CacheConfig(layout="sequence", max_seqs=1, max_seq_len=32, capacity=32, dtype="float32",
                          max_step_tokens=16)
        cache = make_cache(cfg, args.layer_windows(), args.num_kv_heads, args.head_dim, device)
        cache.attention_impl = attention
        cache.declare_step([(cache.seq_new(), 12)])
        if cache.uses_kernels:
            StepInputs(cache).prepare()
        else:
            cache.prepare_step()
        with torch.inference_mode():
            return model(tokens, positions, cache, torch.arange(12, device=device))

    if (arch, attention) not in module_logits:
        module_logits[arch, attention] = logits(KernelChoice(fuse_projections=True))
    plain = module_logits[arch, attention]
    monkeypatch.setattr(layers, "_fused", lambda module, x: module.fused)  # the kernels run in the interpreter
    fused = logits(KernelChoice(fuse_projections=True, fused=True, decode_gemm=gemm))
    assert (fused - plain).abs().max() <= 1e-4 * plain.abs().max()
