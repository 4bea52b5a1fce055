"""Every architecture added on the shared template goes through the same checks on its tiny model: logits equal
transformers' (HF folder and GGUF, both KV layouts) and llama.cpp's, Q8_0 / Q4_0 held quantized near the exact model
with greedy batched == alone, MLX equal to PyTorch, and the CUDA path. What each architecture adds has its own file
(test_gemma2.py, test_granite.py, test_smollm3.py, test_olmo2.py)."""
from __future__ import annotations

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from tests.support import arch_checks as check

pytestmark = pytest.mark.slow  # needs transformers

ARCHS = ["gemma2", "granite", "smollm3", "olmo2", "cohere", "cohere2", "stablelm", "starcoder2"]
# llama.cpp's f16 cache leaves its logits ~1e-3 of their size from exact ones (SmolLM3's tiny logits reach ~15)
LLAMA_CPP_TOLERANCE = 1e-3


@pytest.fixture(scope="module", params=ARCHS)
def files(request, tmp_path_factory) -> tuple:
    """(arch, (HF folder, F32 GGUF, Q8_0 GGUF, Q4_0 GGUF))."""
    return request.param, check.tiny_files(tmp_path_factory.mktemp(request.param), request.param)


@pytest.mark.parametrize("source", [0, 1])  # the HF folder, its F32 GGUF
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(files, source, layout):
    arch, paths = files
    assert check.assert_matches_transformers(paths[0], paths[source], layout).args.model_type == arch


def test_llama_cpp_reads_the_same_model(files):
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(files[1][1])
    assert (got - want).abs().max() < LLAMA_CPP_TOLERANCE * max(5.0, float(want.abs().max())), (got - want).abs().max()


@pytest.mark.parametrize("kind", [2, 3])  # Q8_0 (int8 rows) and Q4_0 (the int4 kernels) on the CPU
def test_quantized_near_exact_and_batched_equals_alone(files, kind):
    check.assert_quantized_near_exact_and_invariant(files[1][kind])


def test_mlx_matches_torch(files):
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(files[1][1], LoadOptions(weights="dequantized")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 2), ("quantized", 3)])
def test_on_cuda(files, weights, kind):
    """Under the decode graphs: Gemma 2's capped scores in the Triton attention, the others' own blocks."""
    check.assert_on_cuda(files[1][kind], weights)
