"""What prompt lookup costs the host: milliseconds a lookup, by how many earlier answers its pool holds.

    python -m bench.lookup_host [--pools 0 8 40 160] [--lookups 2000] [--rounds 5] [--against DIR]

A decoding sequence looks up after each token it appends, with nothing to find (random tokens: the longest path, every
n-gram length asked), in a pool filled first with `pool` earlier turns of 400 tokens (the app's pool keeps 64K
tokens: 160 such answers after a day of chats). On the device a step of the embedded model takes ~1 ms at 8
sessions, so a lookup's host time is a share of the step. `--against DIR`: another checkout (a git worktree of an
earlier commit) whose engine/speculative/lookup.py runs in this process as the baseline, rounds interleaved; one JSON
line per pool size, with the ratio of the two medians.
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import emit  # noqa: E402

LIST_TOKENS = 400


def _module(checkout: Path | None):
    if checkout is None:
        from engine.speculative import lookup

        return lookup
    spec = importlib.util.spec_from_file_location("lookup_baseline", checkout / "engine/speculative/lookup.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def ms_a_lookup(lookup_module, pool: int, lookups: int, seed: int) -> float:
    from engine.sampling import SamplerState, SamplingParams
    from engine.sequence import Sequence

    rng = random.Random(seed)
    drafter = lookup_module.PromptLookup()
    for i in range(pool):  # earlier turns: each joins the pool as it first looks up
        drafter.propose([Sequence(1000 + i, [rng.randrange(1 << 18) for _ in range(LIST_TOKENS)],
                                  SamplerState(SamplingParams()))], [4])
    seq = Sequence(1, [rng.randrange(1 << 18) for _ in range(30)], SamplerState(SamplingParams()))
    appended = [rng.randrange(1 << 18) for _ in range(lookups)]
    start = time.perf_counter()
    for token in appended:
        seq.append(token)
        drafter.propose([seq], [4])
        seq.draft_state.pacing.resume_at = 0  # due again next token, as a sequence that keeps finding drafts is
    return (time.perf_counter() - start) / lookups * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pools", type=int, nargs="+", default=[0, 8, 40, 160])
    ap.add_argument("--lookups", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--against", type=Path, default=None, help="a checkout whose lookup.py is the baseline")
    args = ap.parse_args()
    modules = {"current": _module(None)}
    if args.against:
        modules["baseline"] = _module(args.against)
    for pool in args.pools:
        times: dict[str, list[float]] = {name: [] for name in modules}
        for r in range(args.rounds):
            for name, module in modules.items():
                times[name].append(ms_a_lookup(module, pool, args.lookups, seed=r))
        row = {f"{name}_ms": round(statistics.median(t), 4) for name, t in times.items()}
        if "baseline" in times:
            row["ratio"] = round(statistics.median(times["baseline"]) / statistics.median(times["current"]), 2)
        emit(bench="lookup_host", pool_lists=pool, pool_tokens=pool * LIST_TOKENS, **row)


if __name__ == "__main__":
    main()
