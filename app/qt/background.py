"""Work that reads files, off the GUI thread: a model's headers checked at import, its chat template read for the
settings (0.2-0.5 s each on the GUI thread froze the window). One worker thread runs them in turn; each result comes
back to the GUI thread by a queued signal."""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Signal

# While a job runs, the interpreter hands the GIL over every 1 ms, not 5: PySide releases and takes it back around each
# call into Qt, and a GUI thread that waited 5 ms each time laid out and painted a dialog in 0.4-0.7 s beside a header
# read (a 5 ms heartbeat ticked 3 times in 0.6 s); 1 ms: 0.04-0.35 s.
SWITCH_INTERVAL_S = 0.001

Done = Callable[[Any, Exception | None], None]  # (result, None) or (None, the exception the work raised)


class Background(QObject):
    _done = Signal(object, object, object)  # then, result, error: emitted on the worker, delivered on the GUI thread

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        # one thread: header reads are CPU-bound Python, two at once would only take turns (and a core from the engine)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parley-files")
        self._done.connect(self._deliver)
        self.pending = 0  # works submitted whose result has not been delivered yet

    def run(self, work: Callable[[], Any], then: Done) -> None:
        """`work()` on the worker thread, then `then(result, error)` on this object's (the GUI) thread."""
        self.pending += 1
        self._pool.submit(self._work, work, then)

    def _work(self, work: Callable[[], Any], then: Done) -> None:
        was = sys.getswitchinterval()
        sys.setswitchinterval(min(was, SWITCH_INTERVAL_S))
        try:
            result, error = work(), None
        except Exception as exc:  # noqa: BLE001 - every failure is the caller's to tell
            result, error = None, exc
        finally:
            sys.setswitchinterval(was)
        try:
            self._done.emit(then, result, error)
        except RuntimeError:  # the app is gone (its QObject deleted): nobody waits for the result
            pass

    def finish(self) -> None:
        """Blocks until every work submitted has run and delivers its result now (at quit: nothing waits on the
        event loop any more)."""
        self._pool.submit(lambda: None).result()  # one worker, first in first out: every earlier work has run
        QCoreApplication.sendPostedEvents(self, QEvent.Type.MetaCall)

    def _deliver(self, then: Done, result: Any, error: Exception | None) -> None:
        self.pending -= 1
        then(result, error)
