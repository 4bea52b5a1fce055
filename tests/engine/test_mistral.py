"""Mistral folders (`mistral`; llama.cpp's files say `llama`): the Llama block with head_dim set apart from hidden /
heads (Mistral NeMo), and a sliding window on every layer when the config has one (Mistral 7B v0.1), as transformers
computes them; the GGUF of a windowless folder is a `llama` file that reads the same."""
from __future__ import annotations

import pytest

from engine.models.args import SLIDING
from tests.support import arch_checks as check
from tests.support.tiny_models import make_tiny_hf

pytestmark = pytest.mark.slow  # needs transformers


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_a_windowed_folder_matches_transformers(tmp_path, layout):
    hf = make_tiny_hf("mistral", tmp_path / "hf")
    lm = check.assert_matches_transformers(hf, hf, layout)
    assert lm.args.model_type == "mistral" and lm.args.head_dim == 32
    assert lm.args.sliding_window == 8 and set(lm.args.layer_types) == {SLIDING}


def test_without_a_window_the_folder_and_its_gguf_match_transformers(tmp_path):
    hf, f32, q8, _ = check.tiny_files(tmp_path, "mistral", config={"sliding_window": None})
    assert check.assert_matches_transformers(hf, hf, "sequence").args.sliding_window is None
    assert check.assert_matches_transformers(hf, f32, "sequence").args.model_type == "llama"
    check.assert_quantized_near_exact_and_invariant(q8)
