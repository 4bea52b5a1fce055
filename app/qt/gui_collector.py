"""Python's cyclic garbage collection, moved onto the GUI thread while the app runs.

Left automatic, a collection runs on whichever thread allocates when a threshold trips: the engine thread or a
prompt worker. A Qt object in a reference cycle (a closed chat's widgets and their slots) would then be freed
there, off the GUI thread, which PySide6 does not survive (seen as a segfault in CI). So automatic collection is
off and a timer on the GUI thread collects by the same thresholds Python would use.

What is alive when it starts (the modules imported: torch, Qt; the window; the chats read) lives as long as the app, and
a full collection walked it all on the GUI thread: 230,000 objects, 100-300 ms, whenever one came due before a model's
load froze them (a first run assembling its model, a model that does not load). They are frozen at the start, so a
full collection walks only what was made since.
"""
from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 500  # cyclic garbage waits at most this long; non-cyclic objects are freed at once as always


class GuiThreadCollector(QObject):
    """`start()` turns automatic collection off and collects on a GUI-thread timer; `stop()` gives it back."""

    def __init__(self, interval_ms: int = INTERVAL_MS, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.collect)
        self._was_enabled: bool | None = None  # None: not started

    def start(self) -> GuiThreadCollector:
        if self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.disable()
            gc.freeze()  # cycles among them are never collected: garbage at start is a few hundred objects
            self._timer.start()
        return self

    def stop(self) -> None:
        if self._was_enabled is None:
            return
        self._timer.stop()
        gc.unfreeze()  # collections after the app (a test's, the interpreter's exit) see everything again
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None

    @property
    def running(self) -> bool:
        return self._was_enabled is not None

    def collect(self) -> int | None:
        """Collects the oldest generation whose count is over its threshold, as Python's own trigger would;
        returns the generation collected (None: nothing due)."""
        generation = due_generation(gc.get_count(), gc.get_threshold())
        if generation is not None:
            gc.collect(generation)
        return generation


def due_generation(counts: tuple[int, ...], thresholds: tuple[int, ...]) -> int | None:
    """The oldest generation due, checked young to old: an older one is due only when each younger one is."""
    due = None
    for generation, (count, threshold) in enumerate(zip(counts, thresholds)):
        if threshold <= 0 or count <= threshold:
            break
        due = generation
    return due
