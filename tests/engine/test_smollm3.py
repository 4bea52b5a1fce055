"""SmolLM3 (`smollm3`): what it adds to the shared checks (test_architectures.py): every fourth layer attends without
rotary positions."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.loading.loader import load_model
from engine.models.smollm3 import NOPE
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("smollm3"), "smollm3")


def test_every_fourth_layer_has_no_rotary(smollm3):
    for path in smollm3[:2]:
        lm = load_model(path)
        assert lm.args.layer_types == ["global", "global", "global", NOPE, "global"]
        assert torch.equal(lm.model.rotary[NOPE].inv_freq, torch.zeros(lm.args.head_dim // 2))


def test_the_nope_layer_matters(smollm3):
    """With a rotary on the fourth layer too, the logits move by more than 1: the shared checks would see one given."""
    lm = load_model(smollm3[1])
    nope = full_logits(lm, check.prompt())
    lm.args = lm.model.args = replace(lm.args, rope={**lm.args.rope, NOPE: lm.args.rope["global"]})
    lm.model.reset_buffers("cpu")
    assert (full_logits(lm, check.prompt()) - nope).abs().max() > 1.0
