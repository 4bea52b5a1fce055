"""EXAONE 4.0 (`exaone4`): OLMo 2's post-norm block with per-head q/k norms; the 32B's hybrid attention (three sliding
layers of four, the fourth global and without rotary positions) and the 1.2B's global layers that all rotate."""
from __future__ import annotations

import gguf
import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.loading.loader import LoadOptions, load_model
from engine.models.args import GLOBAL, NOPE, SLIDING
from engine.models.exaone4 import args_from_hf
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits
from tests.support.gguf_export import rewrite_gguf

pytestmark = pytest.mark.slow  # needs transformers

ALL_GLOBAL = {"sliding_window": None, "layer_types": ["full_attention"] * 5}  # EXAONE 4.0 1.2B's choice


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("exaone4"), "exaone4")


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("exaone4-global"), "exaone4", config=ALL_GLOBAL)


@pytest.mark.parametrize("source, layout", [(0, "sequence"), (1, "sequence"), (1, "cell")])  # folder, F32 GGUF
def test_hybrid_logits_match_transformers(hybrid, source, layout):
    lm = check.assert_matches_transformers(hybrid[0], hybrid[source], layout)
    assert lm.args.layer_types == [SLIDING, SLIDING, SLIDING, NOPE, SLIDING] and lm.args.sliding_window == 8
    assert lm.args.rope[SLIDING].factors[-1] == pytest.approx(8.0)  # Llama 3's scaling (a rope_freqs tensor in GGUF)
    assert not lm.model.model.layers[0].self_attn.whole_norm  # q/k normed per head


@pytest.mark.parametrize("source", [0, 1])
def test_global_logits_match_transformers(dense, source):
    lm = check.assert_matches_transformers(dense[0], dense[source], "sequence")
    assert lm.args.layer_types == [GLOBAL] * 5 and lm.args.sliding_window is None


def test_llama_cpp_reads_the_same_model(dense):
    """llama-cpp-python 0.3.36 runs every EXAONE 4 layer as a global, rotated one (its graph predates the hybrid
    attention llama.cpp has now), so the check is on the 1.2B's shape; the hybrid one is checked against transformers."""
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(dense[1])
    assert (got - want).abs().max() < 1e-3 * max(5.0, float(want.abs().max())), (got - want).abs().max()


def test_the_window_and_the_unrotated_global_layers_matter(hybrid, tmp_path):
    """Without the window (every layer global and rotated) the same file gives other logits."""
    plain = rewrite_gguf(gguf.GGUFReader(hybrid[1]), tmp_path / "plain.gguf", extra={"exaone4.attention.sliding_window": 0})
    a, b = full_logits(load_model(hybrid[1]), check.prompt()), full_logits(load_model(plain), check.prompt())
    assert (a - b).abs().max() > 1e-2


def test_a_hub_config_reads_its_pattern():
    """EXAONE 4.0 32B's config.json names its layers by a repeated "LLLG"; an int pattern is a period."""
    config = {"hidden_size": 5120, "intermediate_size": 27392, "num_hidden_layers": 64, "num_attention_heads": 40,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 102400, "rms_norm_eps": 1e-5,
              "sliding_window": 4096, "sliding_window_pattern": "LLLG", "rope_theta": 1000000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}
    args = args_from_hf(config)
    assert args.layer_types[:8] == [SLIDING, SLIDING, SLIDING, NOPE] * 2 and args.sliding_window == 4096
    assert args_from_hf({**config, "sliding_window_pattern": 4}).layer_types == args.layer_types
    with pytest.raises(UnsupportedModelError, match="not one of L and G"):
        args_from_hf({**config, "sliding_window_pattern": "LLXG"})


def test_quantized_near_exact_and_invariant(hybrid):
    check.assert_quantized_near_exact_and_invariant(hybrid[3])


def test_on_mlx(hybrid):
    pytest.importorskip("mlx.core")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(hybrid[1], LoadOptions(weights="dequantized")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 3)])
def test_on_cuda(hybrid, weights, kind):
    check.assert_on_cuda(hybrid[kind], weights)


def test_a_pattern_of_the_wrong_length_is_refused(hybrid, tmp_path):
    check.assert_refused(hybrid[1], tmp_path, "exaone4.attention.sliding_window_pattern", [True, False, True],
                         "pattern lists 3 layers but the model has 5")
