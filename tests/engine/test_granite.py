"""Granite (`granite`): the Llama block with its four scalars; against transformers (HF folder and GGUF, both KV
layouts), llama.cpp, quantized batched == alone, and MLX."""
from __future__ import annotations

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
def granite(tmp_path_factory) -> tuple:
    """(HF folder, F32 GGUF, Q8_0 GGUF, Q4_0 GGUF)."""
    root = tmp_path_factory.mktemp("granite")
    hf = make_tiny_hf("granite", root / "hf")
    return (hf, *(write_gguf(hf, root / f"granite-{t}.gguf", t) for t in ("F32", "Q8_0", "Q4_0")))


def _prompt(n: int = 21) -> list[int]:
    return torch.randint(6, 300, (n,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(granite, source, layout):
    hf, f32 = granite[:2]
    ids = _prompt()
    with torch.no_grad():
        want = load_hf_reference(hf)(torch.tensor([ids])).logits[0]
    lm = load_model(hf if source == "hf" else f32)
    assert lm.args.model_type == "granite"
    torch.testing.assert_close(full_logits(lm, ids, layout, chunk=8), want, atol=5e-5, rtol=1e-4)


def test_both_sources_read_the_scalars(granite):
    for path in granite[:2]:
        args = load_model(path).args
        assert (args.embedding_multiplier, args.residual_multiplier, args.logits_scaling) == (3.0, 0.5, 2.5)
        assert args.attn_scale == pytest.approx(0.4, rel=1e-6)


def test_llama_cpp_reads_the_same_model(granite):
    llama_cpp = pytest.importorskip("llama_cpp")
    ids = _prompt()
    ref = llama_cpp.Llama(model_path=str(granite[1]), n_ctx=256, logits_all=True, verbose=False)
    ref.eval(ids)
    want = torch.tensor(ref.scores[: len(ids)])
    got = full_logits(load_model(granite[1]), ids)
    assert (got - want).abs().max() < 5e-3, (got - want).abs().max()


@pytest.mark.parametrize("kind", [2, 3])  # Q8_0 (int8 rows) and Q4_0 (the int4 kernels) on the CPU
def test_quantized_near_exact_and_batched_equals_alone(granite, kind):
    lm = load_model(granite[kind], LoadOptions(weights="quantized"))
    assert any(isinstance(m, QuantTensor) for m in lm.model.modules())
    exact = full_logits(load_model(granite[kind], LoadOptions(weights="dequantized")), _prompt())
    q = full_logits(lm, _prompt())
    assert (q - exact).abs().max() < 0.05 * exact.abs().max()
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)


def test_mlx_matches_torch(granite):
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(granite[1], LoadOptions(weights="dequantized")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 3)])
def test_on_cuda(granite, weights, kind):
    from tests.engine.test_quantized import _last_logits

    lm = load_model(granite[kind], LoadOptions(device="cuda", dtype="bfloat16", weights=weights))
    exact = load_model(granite[kind], LoadOptions(weights="dequantized"))
    ids = torch.randint(6, lm.args.vocab_size, (24,), generator=torch.Generator().manual_seed(5))
    got, want = _last_logits(lm, ids).float().cpu(), _last_logits(exact, ids)
    assert (got - want).abs().max() < 0.08 * want.abs().max()
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)
