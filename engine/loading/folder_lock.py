"""An exclusive flock on a folder: the models folder while the embedded model is assembled, a converted-cache entry
while it is written. Where the system has no flock (Windows) or refuses one (some network file systems) the block runs
unguarded."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def opened_folder(folder: Path) -> Iterator[int]:
    """A descriptor of `folder`, closed (and any lock on it released) when the block ends."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Holds an exclusive lock on `folder` while the block runs, waiting for another holder to let go."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with opened_folder(folder) as fd:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
