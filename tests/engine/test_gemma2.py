"""Gemma 2 (`gemma2`): every attention score and the logits capped by tanh, sliding layers alternating with global
ones; against transformers (HF folder and GGUF, both KV layouts), llama.cpp, and quantized batched == alone."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from engine.quant.weight import QuantTensor
from tests.engine.test_quantized import assert_batched_equals_alone
from tests.support.engine_helpers import full_logits
from tests.support.gguf_export import write_gguf
from tests.support.tiny_models import load_hf_reference, make_tiny_hf

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory) -> tuple:
    """(HF folder, F32 GGUF, Q8_0 GGUF, Q4_0 GGUF) of a tiny Gemma 2 whose caps (1.5 on scores, 4 on logits) bite."""
    root = tmp_path_factory.mktemp("gemma2")
    hf = make_tiny_hf("gemma2", root / "hf")
    return (hf, *(write_gguf(hf, root / f"gemma2-{t}.gguf", t) for t in ("F32", "Q8_0", "Q4_0")))


def _prompt(n: int = 21) -> list[int]:
    return torch.randint(6, 300, (n,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(gemma2, source, layout):
    hf, f32 = gemma2[:2]
    ids = _prompt()
    with torch.no_grad():
        want = load_hf_reference(hf)(torch.tensor([ids])).logits[0]
    lm = load_model(hf if source == "hf" else f32)
    assert lm.args.model_type == "gemma2"
    got = full_logits(lm, ids, layout, chunk=8)  # 21 tokens in chunks of 8: crosses the window of 8
    torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-4)


def test_the_caps_bite(gemma2):
    """Without the score cap the same weights give other logits: the tests above would see a dropped cap."""
    lm = load_model(gemma2[1])
    capped = full_logits(lm, _prompt())
    for module in lm.model.modules():
        if hasattr(module, "softcap"):
            module.softcap = 0.0
    assert (full_logits(lm, _prompt()) - capped).abs().max() > 1e-2


def test_both_sources_read_the_same_model(gemma2):
    hf, f32 = (load_model(p).args for p in gemma2[:2])
    for args in (hf, f32):
        assert args.attn_softcap == 1.5 and args.final_logit_softcapping == 4.0 and not args.qk_norm
        assert args.layer_types == ["sliding", "global", "sliding"] and args.sliding_window == 8
    same = dict(name="", max_position_embeddings=hf.max_position_embeddings, rms_norm_eps=hf.rms_norm_eps)  # f32 eps
    assert dataclasses.replace(f32, **same) == dataclasses.replace(hf, name="")


def test_llama_cpp_reads_the_same_model(gemma2):
    """llama.cpp's own gemma2 graph on the same file: the caps, the alternating window, the +1-folded norms agree at
    every position (its f16 cache: ~1e-3)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    ids = _prompt()
    ref = llama_cpp.Llama(model_path=str(gemma2[1]), n_ctx=256, logits_all=True, verbose=False)
    ref.eval(ids)
    want = torch.tensor(ref.scores[: len(ids)])
    got = full_logits(load_model(gemma2[1]), ids)
    assert (got - want).abs().max() < 5e-3, (got - want).abs().max()


@pytest.mark.parametrize("kind", [2, 3])  # Q8_0 (int8 rows) and Q4_0 (the int4 kernels) on the CPU
def test_quantized_near_exact_and_batched_equals_alone(gemma2, kind):
    lm = load_model(gemma2[kind], LoadOptions(weights="quantized"))
    assert any(isinstance(m, QuantTensor) for m in lm.model.modules())
    exact = full_logits(load_model(gemma2[kind], LoadOptions(weights="dequantized")), _prompt())
    q = full_logits(lm, _prompt())
    assert (q - exact).abs().max() < 0.05 * exact.abs().max()
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 2), ("quantized", 3)])
def test_on_cuda(gemma2, weights, kind):
    """The capped scores in the Triton attention, under the decode graphs: near the exact model, batched == alone in
    both layouts."""
    from tests.engine.test_quantized import _last_logits

    path = gemma2[kind]
    lm = load_model(path, LoadOptions(device="cuda", dtype="bfloat16", weights=weights))
    exact = load_model(path, LoadOptions(weights="dequantized"))
    ids = torch.randint(6, lm.args.vocab_size, (24,), generator=torch.Generator().manual_seed(5))
    got, want = _last_logits(lm, ids).float().cpu(), _last_logits(exact, ids)
    assert (got - want).abs().max() < 0.08 * want.abs().max()
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)


def test_mlx_matches_torch(gemma2):
    """The MLX backend caps scores by hand (its fused SDPA has no cap)."""
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(gemma2[1], LoadOptions(weights="dequantized")))
