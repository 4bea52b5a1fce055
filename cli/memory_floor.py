"""The least address space Parley can start in. Under a lower limit (ulimit -v, a service's LimitAS) the start died
before any model was looked at, inside an import or a thread's start: a MemoryError or "failed to map segment"
traceback, OpenBLAS's "Memory allocation still failed", a "Fatal Python error" in the server's loader thread, or
"can't start new thread" in the app, or an app that hung after "QThread::start: Thread creation error". Measured with
the CPU build of torch: the app maps 1.1 GB before it looks at a model (its imports 0.81 GB), the server's imports
0.67 GB; every limit under 700 MB failed so, the app at 800 MB, and at 1,030 MB it hung."""
from __future__ import annotations

import sys

FLOOR_BYTES = 1280 << 20  # above what the app maps before a model, below the least a model runs in (embedded: 1.51 GB)


def floor_refusal() -> str | None:
    """One line where this process's address-space limit is under FLOOR_BYTES; None where it is not, or unknown."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft >= FLOOR_BYTES:
        return None
    return (f"parley: this process may use at most {soft / 2**20:,.0f} MB of memory (ulimit -v), and Parley needs "
            f"{FLOOR_BYTES >> 20:,} MB before any model; raise the limit to that and more for the model (the embedded "
            "one runs in 1,600 MB).")


def refuse_below_floor() -> None:
    """Ends the process with that line and status 2, before the imports that would fail under the limit."""
    said = floor_refusal()
    if said is not None:
        print(said, file=sys.stderr)
        sys.exit(2)
