"""Shared pieces of the CPU benchmarks: loading the embedded model once and timing."""
from __future__ import annotations

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
