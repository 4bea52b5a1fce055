"""The one rule for a seed a user gives: the CLI's --seed and the server's "seed" read it alike."""
from __future__ import annotations

SEED_LOW, SEED_END = -(2**63), 2**64  # an int64 (OpenAI's "seed") or an unsigned 64-bit value
SEED_RULE = "any whole number from -2**63 to 2**64 - 1 (-1: a random one; other negatives wrap to 2**64 + seed)"


def user_seed(value: int) -> int | None:
    """None (a random seed) for -1, as llama.cpp; a negative int64 as its unsigned 64 bits, so -5 draws as
    2**64 - 5 does. ValueError outside an int64 or a uint64."""
    if not SEED_LOW <= value < SEED_END:
        raise ValueError(f"a seed must be {SEED_RULE}, not {value}")
    if value == -1:
        return None
    return value % SEED_END
