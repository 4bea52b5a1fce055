"""Shared pieces of the benchmarks: loading the embedded model once and timing."""
from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path


def embedded_model(cache_root: Path):
    """Our loader on the embedded GGUF, with the converted-weights cache under `cache_root`."""
    from engine.loading.default_model import default_model_path
    from engine.loading.loader import LoadOptions, load_model

    path = default_model_path(cache_root / "models")
    return path, load_model(path, LoadOptions(cache_dir=cache_root / "cache"))


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def replay_ms(graph, reps: int, around=contextlib.nullcontext) -> list[float]:
    """GPU ms of each of `reps` replays of a CUDA graph, each between its own events; `around()`, a context
    manager, wraps each replay outside its events (what must be put back between replays)."""
    import torch

    times = []
    for _ in range(reps):
        with around():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times
