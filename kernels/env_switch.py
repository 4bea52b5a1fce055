"""The kernels' on/off environment switches (PARLEY_CPU_KERNEL, PARLEY_PDL), read as people write them."""
from __future__ import annotations

import os

OFF = ("0", "off", "false", "no")  # PARLEY_CPU_KERNEL=off from a forum post was read as on


def switched_off(name: str) -> bool:
    """Whether the variable `name` turns its feature off: 0, off, false or no, in any case and spacing."""
    return os.environ.get(name, "").strip().lower() in OFF
