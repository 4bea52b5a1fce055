"""ERNIE 4.5 dense (`ernie4_5`): the Llama block with a rotary over adjacent pairs of dims, in folders and files alike.
The shared checks (transformers, llama.cpp, quantized, MLX, CUDA) are in test_arch_suite.py; they fail when the q/k
rows are not reordered into the half-split rotary's order."""
from __future__ import annotations

import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.models import llama
from engine.models.ernie4_5 import args_from_hf, sanitize

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 300}


def test_adjacent_pairs_become_halves():
    """Dims (2i, 2i + 1) of each head, which rotate together, move to (i, i + 4) of an 8-dim head."""
    args = args_from_hf(TINY)
    q = torch.arange(4 * 8, dtype=torch.float32)[:, None]
    out = sanitize({"model.layers.0.self_attn.q_proj.weight": q}, args)["model.layers.0.self_attn.q_proj.weight"]
    assert out[:8, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert torch.equal(out, llama.unpermute(q, 4))


def test_embeddings_are_tied_by_default():
    assert args_from_hf(TINY).tie_word_embeddings and not args_from_hf({**TINY, "tie_word_embeddings": False}) \
        .tie_word_embeddings


def test_biased_projections_are_refused():
    with pytest.raises(UnsupportedModelError, match="use_bias"):
        args_from_hf({**TINY, "use_bias": True})
