"""Cyclic garbage is collected on the GUI thread only while the app runs, never on the engine's threads."""
from __future__ import annotations

import gc
import threading
import time

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


def test_what_is_alive_at_the_start_is_left_out_of_full_collections(qapp):
    """The modules, the window and the chats alive when the app starts live as long as it does: a full collection
    walked them all on the GUI thread (230,000 objects in the app before a model froze them: 100-300 ms)."""
    long_lived = [[i] for i in range(300_000)]  # what imports and the window leave, in number
    gc.collect()
    start = time.perf_counter()
    gc.collect(2)
    walked_all = time.perf_counter() - start
    collector = GuiThreadCollector().start()
    try:
        assert gc.get_freeze_count() >= len(long_lived)
        start = time.perf_counter()
        gc.collect(2)  # what the collector runs once the oldest generation is due
        walked_since = time.perf_counter() - start
        Cycle.freed_on.clear()
        for _ in range(20):
            Cycle()  # made after the start: still collected
        gc.collect(2)
        assert len(Cycle.freed_on) == 20
    finally:
        collector.stop()
    assert gc.get_freeze_count() == 0  # after the app, every object is collected as before
    assert walked_since < walked_all / 5, f"{walked_since * 1e3:.1f} ms against {walked_all * 1e3:.1f} ms"


def test_a_model_unloaded_leaves_no_cycles_frozen_for_good(parley, qtbot, imported_llama):
    """Each load froze all that was alive, and frozen cycles are never collected: each load and unload left its model's
    for as long as the app ran (~350 objects for the tiny Llama, ~730 for the embedded Gemma: 6,555 after six of
    each). Once the engine has let the model go they are collected, and the frozen count stays level."""
    models, frozen = parley.models, []
    for _ in range(4):
        models.ensure(imported_llama)
        qtbot.waitUntil(lambda: models.model_id(imported_llama) is not None, timeout=60_000)
        with qtbot.waitSignal(models.freezer.thawed, timeout=30_000):
            models.unload(imported_llama)
        frozen.append(gc.get_freeze_count())
    # before: +350 a cycle (+1,050 over three); then one unload in a few still left its template's ~350 frozen, the
    # engine's drain holding the model as the app collected (tests/app/test_model_unloaded.py); level within ~20 now
    assert max(frozen) - min(frozen) < 150, frozen


def test_what_an_unloaded_model_left_waits_for_no_answer_to_be_streaming(parley, qtbot, imported_llama):
    """Collecting it walks every object (0.1-0.2 s for the app's 230,000 on the GUI thread, every thread paused): run
    mid-stream it would stall the answers the freeze keeps smooth. It waits until no turn is generating."""
    from tests.app.helpers import configure, wait_idle

    models, chat, busy_when_thawed = parley.models, parley.window.current(), []
    models.freezer.thawed.connect(lambda: busy_when_thawed.append(parley.service.busy(chat)))
    configure(parley, chat, temperature=0.0, max_tokens=80)
    parley.window.chat.send("a long answer")
    qtbot.waitUntil(lambda: bool(parley.store.path(chat)[-1].content), timeout=30_000)
    models.unload(imported_llama)
    qtbot.waitUntil(lambda: models.freezer.due or bool(busy_when_thawed), timeout=30_000)  # the engine has let it go
    assert parley.service.busy(chat) and not busy_when_thawed
    wait_idle(parley, qtbot, chat)
    qtbot.waitUntil(lambda: busy_when_thawed == [False], timeout=10_000)
