"""Speculative decoding: drafters propose tokens, one step verifies them (engine/speculative/verify.py)."""
from engine.speculative.drafter import Drafter
from engine.speculative.lookup import LookupConfig, PromptLookup

SPECULATIVE_MODES = ("off", "lookup")


def make_drafter(mode: str) -> Drafter | None:
    """The drafter a `--speculative` mode names; None for off."""
    if mode not in SPECULATIVE_MODES:
        raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, not {mode!r}")
    return PromptLookup(LookupConfig()) if mode == "lookup" else None


__all__ = ["Drafter", "LookupConfig", "PromptLookup", "SPECULATIVE_MODES", "make_drafter"]
