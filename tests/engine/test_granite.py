"""Granite (`granite`): what it adds to the shared checks (test_architectures.py): four scalars, as either source reads
them, and refused when they make no sense."""
from __future__ import annotations

import pytest

from engine.loading.loader import load_model
from tests.support import arch_checks as check

pytestmark = pytest.mark.slow  # needs transformers


@pytest.fixture(scope="module")
def granite(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("granite"), "granite")


def test_both_sources_read_the_scalars(granite):
    for path in granite[:2]:
        args = load_model(path).args
        assert (args.embedding_multiplier, args.residual_multiplier, args.logits_scaling) == (3.0, 0.5, 2.5)
        assert args.attn_scale(0) == pytest.approx(0.4, rel=1e-6)


@pytest.mark.parametrize("key, value, words", [
    ("granite.attention.scale", 0.0, "attention multiplier must be a positive number"),
    ("granite.residual_scale", float("nan"), "residual_multiplier must be a positive number"),
])
def test_bad_scalars_are_refused_in_one_line(granite, tmp_path, key, value, words):
    check.assert_refused(granite[1], tmp_path, key, value, words)
