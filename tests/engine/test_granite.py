"""Granite (`granite`): the Llama block with its four scalars; against transformers (HF folder and GGUF, both KV
layouts), llama.cpp, quantized batched == alone, and MLX."""
from __future__ import annotations

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from tests.support import arch_checks as check

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def granite(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("granite"), "granite")


@pytest.mark.parametrize("source", [0, 1])  # the HF folder, its F32 GGUF
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(granite, source, layout):
    assert check.assert_matches_transformers(granite[0], granite[source], layout).args.model_type == "granite"


def test_both_sources_read_the_scalars(granite):
    for path in granite[:2]:
        args = load_model(path).args
        assert (args.embedding_multiplier, args.residual_multiplier, args.logits_scaling) == (3.0, 0.5, 2.5)
        assert args.attn_scale == pytest.approx(0.4, rel=1e-6)


def test_llama_cpp_reads_the_same_model(granite):
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(granite[1])
    assert (got - want).abs().max() < 5e-3, (got - want).abs().max()


@pytest.mark.parametrize("kind", [2, 3])  # Q8_0 (int8 rows) and Q4_0 (the int4 kernels) on the CPU
def test_quantized_near_exact_and_batched_equals_alone(granite, kind):
    check.assert_quantized_near_exact_and_invariant(granite[kind])


def test_mlx_matches_torch(granite):
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(granite[1], LoadOptions(weights="dequantized")))


@pytest.mark.parametrize("key, value, words", [
    ("granite.attention.scale", 0.0, "attention multiplier must be a positive number"),
    ("granite.residual_scale", float("nan"), "residual_multiplier must be a positive number"),
])
def test_bad_scalars_are_refused_in_one_line(granite, tmp_path, key, value, words):
    check.assert_refused(granite[1], tmp_path, key, value, words)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 3)])
def test_on_cuda(granite, weights, kind):
    check.assert_on_cuda(granite[kind], weights)
