"""The least address space Parley can start in. Under a lower limit (ulimit -v, a service's LimitAS) the start died
before any model was looked at, inside an import or a thread's start: a MemoryError or "failed to map segment"
traceback, OpenBLAS's "Memory allocation still failed", a "Fatal Python error" in the server's loader thread, or
"can't start new thread" in the app. Measured with the CPU build of torch: the app's imports map 0.81 GB, the
server's 0.67 GB; every limit under 700 MB failed so, and the app failed at 800 MB."""
from __future__ import annotations

import sys

FLOOR_BYTES = 1 << 30  # above what the imports map, below the least any model runs in (the embedded one: 1.51 GB)


def floor_refusal() -> str | None:
    """One line where this process's address-space limit is under FLOOR_BYTES; None where it is not, or unknown."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft >= FLOOR_BYTES:
        return None
    return (f"parley: this process may use at most {soft / 2**20:,.0f} MB of memory (ulimit -v), and Parley's own "
            f"libraries take about 0.8 GB before any model; raise the limit to {FLOOR_BYTES >> 30} GB and more "
            "for the model (the embedded one runs in 1.6 GB).")


def refuse_below_floor() -> None:
    """Ends the process with that line and status 2, before the imports that would fail under the limit."""
    said = floor_refusal()
    if said is not None:
        print(said, file=sys.stderr)
        sys.exit(2)
