"""OLMo 3 (`olmo3` folders; llama.cpp writes `olmo2` files with a sliding window): three layers of four slide, and
YaRN scales the full-attention layers only, as transformers and llama.cpp run them. The shared checks
(transformers, llama.cpp, quantized, MLX, CUDA) are in test_arch_suite.py."""
from __future__ import annotations

import math

import gguf
import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.loading.loader import load_model
from engine.models.args import GLOBAL, SLIDING
from engine.models.olmo3 import args_from_hf
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits
from tests.support.gguf_export import rewrite_gguf

pytestmark = pytest.mark.slow  # needs transformers

KINDS = [SLIDING, SLIDING, SLIDING, GLOBAL, SLIDING]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("olmo3"), "olmo3")


@pytest.mark.parametrize("source", [0, 1])  # the folder, its F32 GGUF (logits: test_arch_suite.py)
def test_both_sources_read_the_layout(files, source):
    args = load_model(files[source]).args
    assert args.layer_types == KINDS and args.sliding_window == 8
    assert args.rope[GLOBAL].attn_factor == pytest.approx(1 + 0.1 * math.log(4.0))
    assert args.rope[SLIDING].factors is None and args.rope[SLIDING].attn_factor == 1.0


def test_the_window_and_the_full_layers_own_scaling_matter(files, tmp_path):
    """Read as OLMo 2 (no window: every layer global and scaled), the same file gives other logits, so the checks above
    could not pass by ignoring either."""
    plain = rewrite_gguf(gguf.GGUFReader(files[1]), tmp_path / "no-window.gguf", extra={"olmo2.attention.sliding_window": 0})
    assert load_model(plain).args.layer_types == [GLOBAL] * 5
    a, b = full_logits(load_model(files[1]), check.prompt()), full_logits(load_model(plain), check.prompt())
    assert (a - b).abs().max() > 1e-2


def test_a_hub_config_reads_as_transformers_reads_it():
    """Olmo-3-7B's config.json (v4 keys): rope_scaling is the full layers', the sliding ones rotate plainly."""
    config = {"model_type": "olmo3", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100278, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 65536, "rope_theta": 500000, "sliding_window": 4096,
              "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(32)],
              "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                               "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1}}
    args = args_from_hf(config)
    assert args.layer_types[:4] == [SLIDING, SLIDING, SLIDING, GLOBAL] and args.sliding_window == 4096
    assert args.rope[SLIDING].theta == args.rope[GLOBAL].theta == 500000
    assert args.rope[GLOBAL].factors[-1] == pytest.approx(8.0) and args.rope[SLIDING].factors is None
    assert args.attn_scale(3) == pytest.approx(128 ** -0.5 * 1.2079441541679836 ** 2)
    assert args.attn_scale(0) == pytest.approx(128 ** -0.5)
    from transformers import Olmo3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = Olmo3Config(**{k: v for k, v in config.items() if k != "model_type"})
    inv_freq, gain = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu", layer_type="full_attention")
    base = 1.0 / (500000 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    torch.testing.assert_close(base / torch.tensor(args.rope[GLOBAL].factors, dtype=torch.float64), inv_freq.double(),
                               rtol=1e-6, atol=0)
    assert gain == pytest.approx(args.rope[GLOBAL].attn_factor)


def test_bad_window_settings_are_refused(files, tmp_path):
    check.assert_refused(files[1], tmp_path, "olmo2.attention.sliding_window_pattern", [True, False],
                         "pattern lists 2 layers but the model has 5")
    check.assert_refused(files[1], tmp_path, "olmo2.rope.scaling.yarn_attn_factor", -1.0, "must be a positive number")
    with pytest.raises(UnsupportedModelError, match="positive number"):
        args_from_hf({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                      "vocab_size": 300, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.0,
                                                          "original_max_position_embeddings": 64}})
