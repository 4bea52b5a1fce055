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


def test_answers_whose_drawing_fills_the_frame_take_turns_and_all_end_whole(qtbot):
    """4 compare columns each drew every token batch (~12 ms a column under load: a ~50 ms stall every frame, the
    window stalled about half the time); when drawing an answer fills the frame budget, a frame now draws the answers
    drawn longest ago, the others' tokens merged into their next frame, and every answer's text ends whole."""
    import threading
    import time

    from app.qt.bridge import EngineBridge

    bridge = EngineBridge(EngineConfig(**TINY_ENGINE))  # never started: the feeder thread is the engine thread
    drawn, frames = {sid: "" for sid in range(1, 5)}, []

    def draw(sid, _turn, text, _n):  # what a column's view costs the GUI thread when its text changes
        drawn[sid] += text
        frames.append((bridge.flushes, sid, bridge.pacer.answer_s > 0))
        time.sleep(0.012)

    bridge.text_arrived.connect(draw)
    tokens = [f" t{k}" for k in range(150)]

    def feed():
        for token in tokens:
            for sid in drawn:
                bridge._on_engine_event(ev.TokenDelta(sid, 1, [1], token))
            time.sleep(0.005)

    threading.Thread(target=feed, daemon=True).start()
    qtbot.waitUntil(lambda: all(text == "".join(tokens) for text in drawn.values()), timeout=10_000)
    per_frame, measured = {}, set()
    for flush, sid, known in frames:
        per_frame.setdefault(flush, []).append(sid)
        if known:
            measured.add(flush)
    # the first frames: each answer's first words go out at once, and a frame's cost is known once its marker is back
    # (on a loaded machine that took several frames: the marker waits behind the feeder's events)
    settled = sorted(f for f in measured if f > min(per_frame) + 2)
    assert settled and max(len(per_frame[f]) for f in settled) == 1, per_frame  # one column's drawing a frame, not four
    for sid in drawn:  # none starved: each answer is drawn at least every 4th frame
        mine = [f for f in settled if sid in per_frame[f]]
        assert mine and max(b - a for a, b in zip(mine, mine[1:])) <= 4


def test_the_long_answers_bench_feeds_tokens_as_the_engine_sends_them():
    """bench/gui_long_answers.py sent each answer's head (all but its last 600 tokens) in one delta, which no engine
    does: the window's first render of ~15,000 tokens at once (a 0.3-1.7 s stall) stood for streaming. It now sends a
    delta per turn per step, --per-event tokens each, at --rate steps a second, from the first token."""
    import time

    from bench.gui_long_answers import Feed

    class Bridge:
        def __init__(self):
            self.events = []

        def _on_engine_event(self, e):
            self.events.append((time.perf_counter(), e))

    bridge = Bridge()
    pieces = [(k, f" w{k}") for k in range(20)]
    feed = Feed(bridge, [(1, 1), (2, 1)], pieces, streamed=5, rate=200.0, per_event=3)
    feed._run()
    deltas = [(t, e) for t, e in bridge.events if isinstance(e, ev.TokenDelta)]
    assert [len(e.token_ids) for _, e in deltas if e.session_id == 1] == [3] * 6 + [2]
    for sid in (1, 2):
        assert "".join(e.text for _, e in deltas if e.session_id == sid) == "".join(p for _, p in pieces)
    steps = sorted({round(t, 3) for t, e in deltas if e.session_id == 1})
    assert steps[-1] - steps[0] >= 6 / 200.0 * 0.9  # a step every 1/rate seconds
    assert deltas[0][0] <= feed.streaming_at <= deltas[-1][0] and feed.done.is_set()
