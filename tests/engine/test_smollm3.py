"""SmolLM3 (`smollm3`): the Llama block with every fourth layer NoPE; against transformers (HF folder and GGUF, both KV
layouts), llama.cpp, quantized batched == alone, and MLX."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from engine.models.smollm3 import NOPE
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("smollm3"), "smollm3")


@pytest.mark.parametrize("source", [0, 1])  # the HF folder, its F32 GGUF
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(smollm3, source, layout):
    assert check.assert_matches_transformers(smollm3[0], smollm3[source], layout).args.model_type == "smollm3"


def test_every_fourth_layer_has_no_rotary(smollm3):
    for path in smollm3[:2]:
        lm = load_model(path)
        assert lm.args.layer_types == ["global", "global", "global", NOPE, "global"]
        assert torch.equal(lm.model.rotary[NOPE].inv_freq, torch.zeros(lm.args.head_dim // 2))


def test_the_nope_layer_matters(smollm3):
    """With a rotary on the fourth layer too, the logits move by more than 1: the tests here would see one given."""
    lm = load_model(smollm3[1])
    nope = full_logits(lm, check.prompt())
    lm.args = lm.model.args = replace(lm.args, rope={**lm.args.rope, NOPE: lm.args.rope["global"]})
    lm.model.reset_buffers("cpu")
    assert (full_logits(lm, check.prompt()) - nope).abs().max() > 1.0


def test_llama_cpp_reads_the_same_model(smollm3):
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(smollm3[1])
    # llama.cpp's f16 cache: ~1e-3 of logits this large (~15)
    assert (got - want).abs().max() < 1e-3 * want.abs().max(), (got - want).abs().max()


@pytest.mark.parametrize("kind", [2, 3])  # Q8_0 (int8 rows) and Q4_0 (the int4 kernels) on the CPU
def test_quantized_near_exact_and_batched_equals_alone(smollm3, kind):
    check.assert_quantized_near_exact_and_invariant(smollm3[kind])


def test_mlx_matches_torch(smollm3):
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(smollm3[1], LoadOptions(weights="dequantized")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 3)])
def test_on_cuda(smollm3, weights, kind):
    check.assert_on_cuda(smollm3[kind], weights)
