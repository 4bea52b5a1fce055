"""GLM-4 (`glm4`, the 0414 models): four plain norms around attention and MLP, q/k/v biases, a fused gate/up, and a
rotary over the first half of each head in adjacent pairs."""
from __future__ import annotations

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from engine.models.args import GLOBAL
from tests.support import arch_checks as check

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("glm4"), "glm4")


@pytest.mark.parametrize("source, layout", [(0, "sequence"), (1, "sequence"), (1, "cell")])  # folder, F32 GGUF
def test_logits_match_transformers(files, source, layout):
    """Both sources' q/k rows reordered from adjacent pairs into the partial half-split rotary (else every position
    past 0 differs), the norms where GLM puts them."""
    lm = check.assert_matches_transformers(files[0], files[source], layout)
    assert lm.args.rope[GLOBAL].rotary_dim == 16 and lm.args.attention_bias


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
