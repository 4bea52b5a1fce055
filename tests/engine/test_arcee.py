"""Arcee (`arcee`, AFM-4.5B): the Llama block with down(relu(up(x))²) for the MLP. The shared checks (transformers,
llama.cpp, quantized, MLX, CUDA) are in test_arch_suite.py."""
from __future__ import annotations

import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.models.arcee import args_from_hf
from engine.models.layers import MLP

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 300}


def test_the_mlp_has_no_gate_and_squares_its_relu():
    args = args_from_hf(TINY)
    assert not args.gated_mlp and args.hidden_act == "relu2"
    mlp = MLP(4, 3, "relu2", bias=False)
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
    assert torch.equal(mlp.act(x), torch.tensor([[1.0, 0.0, 0.25, 9.0]]))


def test_biased_projections_are_refused():
    with pytest.raises(UnsupportedModelError, match="biases"):
        args_from_hf({**TINY, "mlp_bias": True})
