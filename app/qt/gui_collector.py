"""Python's cyclic garbage collection, moved onto the GUI thread while the app runs.

Left automatic, a collection runs on whichever thread allocates when a threshold trips: the engine thread or a
prompt worker. A Qt object in a reference cycle (a closed chat's widgets and their slots) would then be freed
there, off the GUI thread, which PySide6 does not survive (seen as a segfault in CI). So automatic collection is
off and a timer on the GUI thread collects by the same thresholds Python would use.

What is alive when it starts (the modules imported: torch, Qt; the window; the chats read) lives as long as the app, and
a full collection walked it all on the GUI thread: 230,000 objects, 100-300 ms, whenever one came due before a model's
load froze them (a first run assembling its model, a model that does not load). They are frozen at the start, so a
full collection walks only what was made since. ModelFreezer does the same after each model's load, and gives back
what an unloaded model left.
"""
from __future__ import annotations

import atexit
import gc
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal

if TYPE_CHECKING:
    from app.qt.bridge import EngineBridge

INTERVAL_MS = 500  # cyclic garbage waits at most this long; non-cyclic objects are freed at once as always
QUIET_CHECK_MS = 250  # how often a thaw put off by a running turn looks again (a set looked at: nothing)


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


class ModelFreezer(QObject):
    """Keeps loaded models' objects out of full collections, and gives back the cycles an unloaded one leaves.

    A loaded model leaves hundreds of thousands of long-lived objects (vocabularies, metadata): full collections
    walking them paused every thread for 50-500 ms mid-stream, so each load freezes what is alive. Frozen cycles are
    never collected: each load and unload of the embedded model left ~700 objects for good (its chat template's Jinja
    environment, its kernels' ctypes handles), the tiny test Llama ~350, and so did any chat closed after a load. Once
    the engine has let a model go (its ModelUnloaded, whoever asked for the unload) and no turn is generating,
    everything is thawed, collected once (a full walk of the app's ~233,000 objects: 0.1-0.24 s on the GUI thread) and
    frozen again."""

    thawed = Signal()  # an unloaded model's leftovers were collected

    def __init__(self, bridge: EngineBridge, quiet_check_ms: int = QUIET_CHECK_MS,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._generating: set[tuple[int, int]] = set()  # (session, turn) of the turns running now
        self.due = False  # a model was let go since the last thaw
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(quiet_check_ms)
        self._timer.timeout.connect(self._thaw_when_quiet)
        bridge.turn_started.connect(self._started)
        bridge.turn_finished.connect(self._finished)
        bridge.turn_failed.connect(self._failed)
        bridge.model_unloaded.connect(self._let_go)
        atexit.unregister(gc.unfreeze)
        atexit.register(gc.unfreeze)  # interpreter shutdown collects them as usual

    def loaded(self) -> None:
        """Freezes what is alive now (a model just loaded): no walk on the GUI thread, its garbage waits for a thaw."""
        gc.freeze()

    def _let_go(self, _model_id: int) -> None:
        """The engine has let a model go: its leftovers are collected at the first quiet moment."""
        self.due = True
        self._thaw_when_quiet()

    def _thaw_when_quiet(self) -> None:
        if not self.due:
            return
        if self._generating:  # a full collection would stall the stream: tried again later
            self._timer.start()
            return
        self.due = False
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.thawed.emit()

    def _started(self, session: int, turn: int) -> None:
        self._generating.add((session, turn))

    def _finished(self, session: int, turn: int, *_outcome: Any) -> None:
        self._generating.discard((session, turn))

    def _failed(self, session: int, turn: int | None, _message: str) -> None:
        self._generating -= {key for key in self._generating if key[0] == session and turn in (None, key[1])}
