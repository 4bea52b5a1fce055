"""Memory estimates and refusals, as a user with too little memory meets them."""
from __future__ import annotations

import re

import pytest

from engine.errors import ModelLoadError


def _sizes(message: str) -> tuple[float, float]:
    m = re.fullmatch(r"\S+ needs ~(\d+\.\d+) GB, (\d+\.\d+) GB of memory free\.", message)
    assert m, message
    return float(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("needed_gb, free_gb", [(0.4, 0.6), (2.0, 2.2), (0.5, 0.74)])
def test_refusal_names_a_need_larger_than_what_is_free(monkeypatch, needed_gb, free_gb):
    """A refusal whose two numbers read "needs ~0.4 GB, 0.6 GB free" tells the user the model fits: the need named
    is what the check compares, headroom included, and it shows larger than the free memory."""
    from engine.memory import check_fits

    monkeypatch.setattr("engine.memory.available_bytes", lambda device: int(free_gb * 2**30))
    with pytest.raises(ModelLoadError) as err:
        check_fits(int(needed_gb * 2**30), "cpu", "m.gguf")
    need, free = _sizes(str(err.value))
    assert need > free
