"""Seed-OSS (`seed_oss`): the Llama block with q/k/v biases and heads wider than hidden / heads."""
from __future__ import annotations

import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.loading.loader import LoadOptions, load_model
from engine.models.seed_oss import args_from_hf
from tests.support import arch_checks as check

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("seed_oss"), "seed_oss")


@pytest.mark.parametrize("source, layout", [(0, "sequence"), (1, "sequence"), (1, "cell")])  # folder, F32 GGUF
def test_logits_match_transformers(files, source, layout):
    lm = check.assert_matches_transformers(files[0], files[source], layout)
    assert lm.args.attention_bias and lm.args.head_dim == 32


def test_llama_cpp_reads_the_same_model(files):
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(files[1])
    assert (got - want).abs().max() < 1e-3 * max(5.0, float(want.abs().max())), (got - want).abs().max()


def test_quantized_near_exact_and_invariant(files):
    check.assert_quantized_near_exact_and_invariant(files[3])


def test_on_mlx(files):
    pytest.importorskip("mlx.core")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(files[1], LoadOptions(weights="dequantized")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 3)])
def test_on_cuda(files, weights, kind):
    check.assert_on_cuda(files[kind], weights)


@pytest.mark.parametrize("key", ["attention_out_bias", "mlp_bias"])
def test_biases_no_checkpoint_has_are_refused(key):
    config = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "vocab_size": 300, key: True}
    with pytest.raises(UnsupportedModelError, match=key):
        args_from_hf(config)
