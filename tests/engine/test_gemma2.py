"""Gemma 2 (`gemma2`): every attention score and the logits capped by tanh, sliding layers alternating with global
ones; against transformers (HF folder and GGUF, both KV layouts), llama.cpp, quantized batched == alone, and MLX."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory) -> tuple:
    """The tiny Gemma 2's caps (1.5 on scores, 4 on logits) bite."""
    return check.tiny_files(tmp_path_factory.mktemp("gemma2"), "gemma2")


@pytest.mark.parametrize("source", [0, 1])  # the HF folder, its F32 GGUF
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(gemma2, source, layout):
    assert check.assert_matches_transformers(gemma2[0], gemma2[source], layout).args.model_type == "gemma2"


def test_the_caps_bite(gemma2):
    """Without the score cap the same weights give other logits: the tests above would see a dropped cap."""
    lm = load_model(gemma2[1])
    capped = full_logits(lm, check.prompt())
    for module in lm.model.modules():
        if hasattr(module, "softcap"):
            module.softcap = 0.0
    assert (full_logits(lm, check.prompt()) - capped).abs().max() > 1e-2


def test_both_sources_read_the_same_model(gemma2):
    hf, f32 = (load_model(p).args for p in gemma2[:2])
    for args in (hf, f32):
        assert args.attn_softcap == 1.5 and args.final_logit_softcapping == 4.0 and not args.qk_norm
        assert args.layer_types == ["sliding", "global", "sliding"] and args.sliding_window == 8
    same = dict(name="", max_position_embeddings=hf.max_position_embeddings, rms_norm_eps=hf.rms_norm_eps)  # f32 eps
    assert dataclasses.replace(f32, **same) == dataclasses.replace(hf, name="")


def test_llama_cpp_reads_the_same_model(gemma2):
    """The caps, the alternating window, the +1-folded norms as llama.cpp's own gemma2 graph reads them."""
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(gemma2[1])
    assert (got - want).abs().max() < 5e-3, (got - want).abs().max()


@pytest.mark.parametrize("kind", [2, 3])  # Q8_0 (int8 rows) and Q4_0 (the int4 kernels) on the CPU
def test_quantized_near_exact_and_batched_equals_alone(gemma2, kind):
    check.assert_quantized_near_exact_and_invariant(gemma2[kind])


def test_mlx_matches_torch(gemma2):
    """The MLX backend caps scores by hand (its fused SDPA has no cap)."""
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(gemma2[1], LoadOptions(weights="dequantized")))


def test_a_negative_cap_is_refused_in_one_line(gemma2, tmp_path):
    check.assert_refused(gemma2[1], tmp_path, "gemma2.attn_logit_softcapping", -1.0,
                         "attn_softcap must be a positive number")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 2), ("quantized", 3)])
def test_on_cuda(gemma2, weights, kind):
    """The capped scores in the Triton attention, under the decode graphs."""
    check.assert_on_cuda(gemma2[kind], weights)
