"""OLMo 2 (`olmo2`): what it adds to the shared checks (test_architectures.py): q/k norms over the whole projection."""
from __future__ import annotations

import pytest

from engine.loading.loader import load_model
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers


def test_the_norms_span_the_whole_projection(tmp_path):
    """Both sources read whole-projection q/k norms; normed per head instead, the logits move."""
    hf, f32 = check.tiny_files(tmp_path, "olmo2")[:2]
    for path in (hf, f32):
        lm = load_model(path)
        attn = lm.model.model.layers[0].self_attn
        assert lm.args.qk_norm_whole and attn.q_norm.weight.shape == (attn.n_heads * attn.head_dim,)
    whole = full_logits(lm, check.prompt())
    for layer in lm.model.model.layers:  # each head normed alone, with the first head's weights
        attn = layer.self_attn
        attn.whole_norm = False
        attn.q_norm.weight.data = attn.q_norm.weight.data[: attn.head_dim].clone()
        attn.k_norm.weight.data = attn.k_norm.weight.data[: attn.head_dim].clone()
    assert (full_logits(lm, check.prompt()) - whole).abs().max() > 1e-2
