"""YaRN rotary scaling (Qwen2.5 / Qwen3 long-context configs and their GGUF files, OLMo 3, DeepSeek): frequencies
interpolated by a ramp between the fast and slow pairs and q·k scaled by the attention factor squared, as transformers
computes them from a folder and llama.cpp from its file."""
from __future__ import annotations

import math

import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.loading.loader import LoadOptions, load_model
from engine.models.args import rope_from_hf, yarn_factors
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers

# factor 4 over an original context of 64: the tiny heads' 16 pairs span all three bands of the ramp
YARN = {"max_position_embeddings": 256, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0,
                                                            "factor": 4.0, "original_max_position_embeddings": 64}}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("yarn"), "qwen3", config=YARN)


@pytest.mark.parametrize("source", [0, 1])  # the folder, its F32 GGUF
def test_logits_match_transformers(files, source):
    lm = check.assert_matches_transformers(files[0], files[source], "sequence")
    assert lm.args.attn_factor == pytest.approx(1 + 0.1 * math.log(4.0))
    factors = lm.args.rope["global"].factors
    assert factors[0] == pytest.approx(1.0) and factors[-1] == pytest.approx(4.0)  # fast pairs kept, slow ones divided


def test_llama_cpp_reads_the_same_model(files):
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(files[1])
    assert (got - want).abs().max() < 1e-3 * max(5.0, float(want.abs().max())), (got - want).abs().max()


def test_yarn_changes_the_logits(files, tmp_path):
    """The same weights without the scaling give other logits: the checks above could not pass by ignoring it."""
    plain = check.tiny_files(tmp_path, "qwen3")[0]
    ids = check.prompt()
    a = full_logits(load_model(files[0], LoadOptions()), ids, "sequence")
    b = full_logits(load_model(plain, LoadOptions()), ids, "sequence")
    assert (a - b).abs().max() > 1e-2


def test_the_ramp_as_transformers_computes_it():
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = Qwen3Config(head_dim=128, max_position_embeddings=512,
                         rope_parameters=YARN["rope_parameters"] | {"factor": 8.0, "beta_fast": 16})
    inv_freq, gain = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    rope = rope_from_hf(config.rope_parameters, 128)
    base = 1.0 / (1000000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    torch.testing.assert_close(base / torch.tensor(rope.factors, dtype=torch.float64), inv_freq.double(),
                               rtol=1e-6, atol=0)
    assert rope.attn_factor == pytest.approx(gain)
    assert yarn_factors(10000.0, 8, 1.0, 64) == [1.0] * 4  # factor 1: nothing moves


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 3)])
def test_on_cuda(files, weights, kind):
    """The scaled frequencies in the fused rope kernels, the attention factor in the Triton attention's scale."""
    check.assert_on_cuda(files[kind], weights)


def test_bad_yarn_settings_are_refused(files, tmp_path):
    check.assert_refused(files[1], tmp_path, "qwen3.rope.scaling.factor", 0.25, "at least 1")
    check.assert_refused(files[1], tmp_path, "qwen3.rope.scaling.type", "dynamic", "scaling type 'dynamic'")
    with pytest.raises(UnsupportedModelError, match="at least 1"):
        rope_from_hf({"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 64}, 64)
    with pytest.raises(UnsupportedModelError, match="original_max_position_embeddings"):
        rope_from_hf({"rope_type": "yarn", "factor": 2.0}, 64)
