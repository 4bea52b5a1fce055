"""The bridge from engine events to Qt signals: token deltas merged a frame at a time, answers ending a frame apart."""
from __future__ import annotations

from engine import events as ev
from engine.runtime import EngineConfig

from tests.app.conftest import TINY_ENGINE


def test_answers_that_end_together_end_a_frame_apart_in_order(qtbot):
    """4 compare columns ending in one frame rendered all their last blocks at once (a 190-line code block each:
    ~40 ms of highlighting apiece, a 200-300 ms stall on a 2-core Xeon); each end now goes out in a frame of its own,
    and what came after it stays after it."""
    from app.qt.bridge import EngineBridge

    bridge = EngineBridge(EngineConfig(**TINY_ENGINE))  # never started: the test is the engine thread
    seen = []
    bridge.text_arrived.connect(lambda sid, _turn, text, _n: seen.append(("text", sid, text, bridge.flushes)))
    bridge.turn_finished.connect(lambda sid, *_: seen.append(("end", sid, "", bridge.flushes)))
    bridge.turn_started.connect(lambda sid, _turn: seen.append(("start", sid, "", bridge.flushes)))
    stats = ev.TurnStats(1, 1, 1, 0.1, 10.0, 2, 512)
    for sid in range(1, 5):
        bridge._on_engine_event(ev.TokenDelta(sid, 1, [7], f"last {sid}"))
    for sid in range(1, 5):
        bridge._on_engine_event(ev.Finished(sid, 1, "stop", f"last {sid}", stats))
    bridge._on_engine_event(ev.Started(1, 2))
    bridge._on_engine_event(ev.TokenDelta(1, 2, [8], "next"))
    qtbot.waitUntil(lambda: len(seen) == 10, timeout=2_000)
    for sid in range(1, 5):  # each chat's events in the order the engine sent them
        kinds = [(kind, text) for kind, of, text, _ in seen if of == sid]
        assert kinds == [("text", f"last {sid}"), ("end", "")] + ([("start", ""), ("text", "next")] if sid == 1 else [])
    ends = [(sid, flush) for kind, sid, _text, flush in seen if kind == "end"]
    assert [sid for sid, _ in ends] == [1, 2, 3, 4]
    assert len({flush for _, flush in ends}) == 4  # one end a flush
