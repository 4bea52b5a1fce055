"""OLMo 2 (`olmo2`): norms after each sublayer and q/k norms over the whole projection; against transformers (HF folder
and GGUF, both KV layouts), llama.cpp, quantized batched == alone, and MLX."""
from __future__ import annotations

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from tests.support import arch_checks as check

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("olmo2"), "olmo2")


@pytest.mark.parametrize("source", [0, 1])  # the HF folder, its F32 GGUF
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(olmo2, source, layout):
    lm = check.assert_matches_transformers(olmo2[0], olmo2[source], layout)
    assert lm.args.model_type == "olmo2" and lm.args.qk_norm_whole


def test_llama_cpp_reads_the_same_model(olmo2):
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(olmo2[1])
    assert (got - want).abs().max() < 1e-3 * max(5.0, float(want.abs().max())), (got - want).abs().max()


@pytest.mark.parametrize("kind", [2, 3])  # Q8_0 (int8 rows) and Q4_0 (the int4 kernels) on the CPU
def test_quantized_near_exact_and_batched_equals_alone(olmo2, kind):
    check.assert_quantized_near_exact_and_invariant(olmo2[kind])


def test_mlx_matches_torch(olmo2):
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(olmo2[1], LoadOptions(weights="dequantized")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 3)])
def test_on_cuda(olmo2, weights, kind):
    check.assert_on_cuda(olmo2[kind], weights)
