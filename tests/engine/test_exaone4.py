"""EXAONE 4.0 (`exaone4`): OLMo 2's post-norm block with per-head q/k norms; the 32B's hybrid attention (three sliding
layers of four, the fourth global and without rotary positions) and the 1.2B's global layers that all rotate. The
shared checks (transformers, llama.cpp on the 1.2B's layout, quantized, MLX, CUDA) are in test_arch_suite.py."""
from __future__ import annotations

import gguf
import pytest

from engine.errors import UnsupportedModelError
from engine.loading.loader import load_model
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


@pytest.mark.parametrize("source", [0, 1])  # the folder, its F32 GGUF (logits: test_arch_suite.py)
def test_both_sources_read_the_hybrid_layout(hybrid, source):
    lm = load_model(hybrid[source])
    assert lm.args.layer_types == [SLIDING, SLIDING, SLIDING, NOPE, SLIDING] and lm.args.sliding_window == 8
    assert lm.args.rope[SLIDING].factors[-1] == pytest.approx(8.0)  # Llama 3's scaling (a rope_freqs tensor in GGUF)
    assert not lm.model.model.layers[0].self_attn.whole_norm  # q/k normed per head


def test_without_a_window_every_layer_is_global(tmp_path):
    hf, f32 = check.tiny_files(tmp_path, "exaone4", config=ALL_GLOBAL)[:2]
    for source in (hf, f32):
        args = load_model(source).args
        assert args.layer_types == [GLOBAL] * 5 and args.sliding_window is None


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


def test_a_pattern_of_the_wrong_length_is_refused(hybrid, tmp_path):
    check.assert_refused(hybrid[1], tmp_path, "exaone4.attention.sliding_window_pattern", [True, False, True],
                         "pattern lists 3 layers but the model has 5")
