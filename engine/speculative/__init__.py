"""Speculative decoding: drafters propose tokens, one step verifies them (engine/speculative/verify.py)."""
from engine.speculative.drafter import Drafter
from engine.speculative.lookup import LookupConfig, PromptLookup

SPECULATIVE_MODES = ("auto", "off", "lookup", "draft")


def check_mode(mode: str) -> None:
    if mode not in SPECULATIVE_MODES:
        raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, not {mode!r}")


def make_drafter(mode: str, graphs: bool = False) -> Drafter | None:
    """The model-free drafter a `--speculative` mode names; None for off (and for draft: build_runtime makes that
    one from the draft model). `auto` is lookup, except where decode steps replay CUDA graphs: verify steps run
    eagerly there, which costs more than drafts save with several chats (bench/speculative.py)."""
    check_mode(mode)
    if mode == "lookup" or (mode == "auto" and not graphs):
        return PromptLookup(LookupConfig())
    return None


__all__ = ["Drafter", "LookupConfig", "PromptLookup", "SPECULATIVE_MODES", "check_mode", "make_drafter"]
