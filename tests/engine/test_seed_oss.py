"""Seed-OSS (`seed_oss`): the Llama block with q/k/v biases and heads wider than hidden / heads. The shared checks
(transformers, llama.cpp, quantized, MLX, CUDA) are in test_arch_suite.py."""
from __future__ import annotations

import pytest

from engine.errors import UnsupportedModelError
from engine.models.seed_oss import args_from_hf

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 300}


def test_qkv_biases_are_on_by_default():
    assert args_from_hf(TINY).attention_bias and not args_from_hf({**TINY, "attention_bias": False}).attention_bias


@pytest.mark.parametrize("key", ["attention_out_bias", "mlp_bias"])
def test_biases_no_checkpoint_has_are_refused(key):
    with pytest.raises(UnsupportedModelError, match=key):
        args_from_hf({**TINY, key: True})
