"""Gemma 2 (`gemma2`): what it adds to the shared checks (test_architectures.py): every attention score and the logits
capped by tanh, sliding layers alternating with global ones, as either source reads them."""
from __future__ import annotations

import dataclasses

import pytest

from engine.loading.loader import load_model
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory) -> tuple:
    """The tiny Gemma 2's caps (1.5 on scores, 4 on logits) bite."""
    return check.tiny_files(tmp_path_factory.mktemp("gemma2"), "gemma2")


def test_the_caps_bite(gemma2):
    """Without the score cap the same weights give other logits: the shared checks would see a dropped cap."""
    lm = load_model(gemma2[1])
    capped = full_logits(lm, check.prompt())
    for module in lm.model.modules():
        if hasattr(module, "softcap"):
            module.softcap = 0.0
    assert (full_logits(lm, check.prompt()) - capped).abs().max() > 1e-2


def test_both_sources_read_the_same_model(gemma2):
    hf, f32 = (load_model(p).args for p in gemma2[:2])
    for args in (hf, f32):
        assert args.attn_softcap == 1.5 and args.final_logit_softcapping == 4.0 and not args.qk_norm
        assert args.layer_types == ["sliding", "global", "sliding"] and args.sliding_window == 8
    same = dict(name="", max_position_embeddings=hf.max_position_embeddings, rms_norm_eps=hf.rms_norm_eps)  # f32 eps
    assert dataclasses.replace(f32, **same) == dataclasses.replace(hf, name="")


def test_a_negative_cap_is_refused_in_one_line(gemma2, tmp_path):
    check.assert_refused(gemma2[1], tmp_path, "gemma2.attn_logit_softcapping", -1.0,
                         "attn_softcap must be a positive number")
