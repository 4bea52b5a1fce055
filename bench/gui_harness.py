"""Shared by the GUI benchmark and the screenshot script: a fresh data folder and event pumping."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication


def fresh_data_dir(shared: str) -> str:
    """A new, empty data folder whose models/ and cache/ point into `shared`, so the converted model is reused."""
    root = Path(tempfile.mkdtemp(prefix="parley-"))
    for name in ("models", "cache"):
        (Path(shared) / name).mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(Path(shared) / name)
    return str(root)


def pump_until(predicate, timeout: float, nap: float = 0.001) -> bool:
    """Runs the Qt event loop until predicate() holds or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        QCoreApplication.processEvents()
        time.sleep(nap)
    return True
