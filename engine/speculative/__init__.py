"""Speculative decoding: drafters propose tokens, one step verifies them (engine/speculative/verify.py)."""
from engine.speculative.drafter import Drafter, PacingConfig
from engine.speculative.lookup import LookupConfig, PromptLookup

SPECULATIVE_MODES = ("auto", "off", "lookup", "draft", "dflash")


def check_mode(mode: str) -> None:
    if mode not in SPECULATIVE_MODES:
        raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, not {mode!r}")


GRAPH_MAX_IDLE = 16  # decode steps at most between lookups that find nothing, on CUDA graph runners
TILE_SEQUENCES = 8  # sequences that may draft in one step where the CPU multiplies on AMX tiles (measured at 8)


def make_drafter(mode: str, verify_rows: int | None = None, tiled: bool = False) -> Drafter | None:
    """The model-free drafter a `--speculative` mode names; None for off. For draft and dflash it is lookup too:
    build_runtime replaces it by the draft model's, and keeps it where that one cannot draft. `auto` is lookup: on text with
    nothing to draft from it measured 0.97-1.02x of off on the CPU and 0.98-1.03x on the H200, and 2-4.8x where the
    answer repeats its input (docs/SPECULATIVE.md). `verify_rows`: a CUDA runner's verify rows (ModelRunner.verify_rows:
    its largest decode graph, or its quantized GEMMs' row tile); there verify steps replay graphs, so that many
    sequences may draft (the batcher keeps each step within those rows: 8 sessions measured 1.05-1.59x with all
    drafting, 0.97x with two), where the CPU drafts for two at most. `tiled`: the CPU multiplies most of the model on
    AMX tiles (ModelRunner.tiled), where a step's extra rows cost little: up to TILE_SEQUENCES draft, from 3-grams
    while more than two do (8 sessions: 1.37x code_edit, 1.35x summarise, 1.01x open chat; docs/SPECULATIVE.md)."""
    check_mode(mode)
    if mode == "off":
        return None
    if not verify_rows and tiled:
        return PromptLookup(LookupConfig(shortest_shared=3, pacing=PacingConfig(most_sequences=TILE_SEQUENCES)))
    if not verify_rows:
        return PromptLookup(LookupConfig())
    # a step due for a lookup cannot be queued ahead of the last one's ids: where nothing matches, look seldom
    return PromptLookup(LookupConfig(pacing=PacingConfig(most_sequences=verify_rows), max_idle=GRAPH_MAX_IDLE))


__all__ = ["Drafter", "LookupConfig", "PromptLookup", "SPECULATIVE_MODES", "check_mode", "make_drafter"]
