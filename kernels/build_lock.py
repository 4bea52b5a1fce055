"""One build at a time of a cached library: a second process starting at once waits for the first's build and loads
its result, rather than compiling the same sources beside it (twice the CPU for seconds on a 2-core laptop)."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

WAIT_S = 300.0  # at most this long behind another build (a hung compiler); then this one builds too
POLL_S = 0.05


@contextlib.contextmanager
def build_lock(lock_file: Path, wait_s: float = WAIT_S) -> Iterator[bool]:
    """Holds an exclusive flock on `lock_file` while the block runs; yields whether it has it. None is waited for where
    the file cannot be made (a read-only cache folder: that build is private), the system has no flock (Windows) or
    the file system refuses one: the block runs unguarded, which is safe (the library is renamed into place whole)."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        yield _take(fd, fcntl, wait_s)
    finally:
        os.close(fd)  # releases the lock; a killed holder's goes with its process


def _take(fd: int, fcntl, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        except OSError:  # ENOLCK on some network mounts
            return False
