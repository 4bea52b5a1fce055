"""The checks each newer architecture's tiny model goes through (tests/support/arch_checks.py), once per architecture:
logits equal to transformers' from the folder and its F32 GGUF (both KV layouts), to llama.cpp's from the file,
quantized weights near the exact model with greedy batched == alone, MLX equal to PyTorch, and the CUDA path. What
an architecture adds is tested in its own file (test_<arch>.py)."""
from __future__ import annotations

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from tests.support import arch_checks as check

pytestmark = pytest.mark.slow  # needs transformers

ARCHS = ("olmo3", "exaone4", "seed_oss", "ernie4_5", "glm4", "arcee", "granitemoehybrid")
# llama-cpp-python 0.3.36 runs EXAONE 4's hybrid attention all-global (its graph predates llama.cpp's hybrid one), so
# llama.cpp checks the 1.2B's layout; test_exaone4.py checks the hybrid one against transformers
LLAMA_CPP_CONFIG = {"exaone4": {"sliding_window": None, "layer_types": ["full_attention"] * 5}}


def test_every_model_type_has_its_module_and_refusals_name_real_ones():
    from engine.models import MODULES, NAMED, RUNS, architecture

    for model_type in MODULES:
        assert architecture(model_type).ARCH  # imports, and names the arch its files say
    assert set(NAMED) <= set(MODULES) and all(t in RUNS for t in NAMED)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    built: dict[tuple[str, bool], tuple] = {}

    def files(arch: str, for_llama_cpp: bool = False) -> tuple:
        config = LLAMA_CPP_CONFIG.get(arch) if for_llama_cpp else None
        key = (arch, config is not None)
        if key not in built:
            built[key] = check.tiny_files(tmp_path_factory.mktemp(arch), arch, config=config)
        return built[key]

    return files


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source, layout", [(0, "sequence"), (1, "sequence"), (1, "cell")])  # folder, F32 GGUF
def test_logits_match_transformers(tiny, arch, source, layout):
    files = tiny(arch)
    check.assert_matches_transformers(files[0], files[source], layout)


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_reads_the_same_model(tiny, arch):
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(tiny(arch, for_llama_cpp=True)[1])
    assert (got - want).abs().max() < 1e-3 * max(5.0, float(want.abs().max())), (got - want).abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_near_exact_and_invariant(tiny, arch):
    check.assert_quantized_near_exact_and_invariant(tiny(arch)[3])


@pytest.mark.parametrize("arch", ARCHS)
def test_on_mlx(tiny, arch):
    """From the folder (its own model type: OLMo 3's file says olmo2)."""
    pytest.importorskip("mlx.core")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(tiny(arch)[0], LoadOptions(weights="dequantized")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 3)])
def test_on_cuda(tiny, arch, weights, kind):
    check.assert_on_cuda(tiny(arch)[kind], weights)
