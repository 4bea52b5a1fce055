"""Cyclic garbage is collected on the GUI thread only while the app runs, never on the engine's threads."""
from __future__ import annotations

import gc
import threading

from app.qt.gui_collector import GuiThreadCollector, due_generation


def test_the_oldest_generation_over_its_threshold_is_due():
    assert due_generation((10, 0, 0), (700, 10, 10)) is None
    assert due_generation((701, 3, 0), (700, 10, 10)) == 0
    assert due_generation((701, 11, 4), (700, 10, 10)) == 1
    assert due_generation((701, 11, 11), (700, 10, 10)) == 2
    assert due_generation((5, 11, 11), (700, 10, 10)) is None  # an older one is due only with the younger ones
    assert due_generation((10_000, 50, 50), (0, 10, 10)) is None  # threshold 0: collection switched off


class Cycle:
    freed_on: list[str] = []

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        Cycle.freed_on.append(threading.current_thread().name)


def test_a_cycle_dropped_on_a_worker_thread_is_freed_on_the_gui_thread(qtbot, qapp):
    collector = GuiThreadCollector(interval_ms=20).start()
    try:
        assert not gc.isenabled() and collector.running
        Cycle.freed_on.clear()

        def work() -> None:
            for _ in range(50):
                Cycle()
                [[] for _ in range(2_000)]  # enough allocations that Python's own trigger would have fired here

        worker = threading.Thread(target=work, name="engine-like")
        worker.start()
        worker.join()
        churn = []
        qtbot.waitUntil(lambda: churn.append([[] for _ in range(1_000)]) or len(Cycle.freed_on) == 50, timeout=10_000)
        assert set(Cycle.freed_on) == {threading.main_thread().name}
    finally:
        collector.stop()
    assert gc.isenabled() and not collector.running


def test_stop_leaves_collection_off_when_it_was_off_before(qapp):
    gc.disable()
    try:
        collector = GuiThreadCollector().start()
        collector.stop()
        assert not gc.isenabled()
    finally:
        gc.enable()
