"""EngineBridge: the one hop from engine events (engine thread) to Qt signals (GUI thread).

The engine thread only appends to a locked list and, when the list was empty, emits `_wake` (a queued
connection, since the bridge lives on the GUI thread). The GUI thread drains the list at most
`max_fps` times a second and merges consecutive token deltas per turn, so a burst of tokens from eight
chats costs one repaint each frame, not one per token; where drawing a frame takes longer (4 compare columns: ~4 ms
each on a 2-core Xeon, more under load), the drains space out to fit (app/qt/frame_pacer.py). Answers that end
together end a frame apart: each one's end renders its last blocks whole (a 190-line code block that streamed in runs
that may read otherwise: ~40 ms of highlighting on a 2-core Xeon), and 4 compare columns ending in one frame stalled
the window for all of them at once.
"""
from __future__ import annotations

import threading
import time

from PySide6.QtCore import QObject, QTimer, Signal

from app.qt.frame_pacer import FramePacer
from engine import events as ev
from engine.engine import Engine
from engine.runtime import EngineConfig


class EngineBridge(QObject):
    text_arrived = Signal(int, int, str, int)  # session, turn, text, tokens
    turn_started = Signal(int, int)
    turn_queued = Signal(int, int, int)  # session, turn, position
    turn_finished = Signal(int, int, str, str, object)  # session, turn, reason, text, TurnStats
    turn_failed = Signal(int, object, str, str)  # session, turn or None, message, code (engine/errors.py) or ""
    context_usage = Signal(int, int, int, int)  # session, used, limit, dropped messages
    model_progress = Signal(int, str, float)
    model_loaded = Signal(int, str, object)
    model_unloaded = Signal(int)  # the engine has let the model go (whoever asked)
    model_failed = Signal(int, str)
    _wake = Signal()

    def __init__(self, config: EngineConfig, max_fps: int = 60, parent: QObject | None = None):
        super().__init__(parent)
        self._lock = threading.Lock()
        self._pending: list[ev.Event] = []
        self._frame_s = 1.0 / max_fps
        self.pacer = FramePacer(self._frame_s, self)
        self._drawn_at: dict[tuple[int, int], float] = {}  # when each streaming turn's text last went out
        self._last_flush = 0.0
        self.flushes = 0  # how many times the GUI thread drained events (tests and benchmarks read it)
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self._flush)
        self._wake.connect(self._on_wake)
        self.engine = Engine(config, on_event=self._on_engine_event)

    def start(self) -> "EngineBridge":
        self.engine.start()
        return self

    def shutdown(self) -> None:
        self.engine.shutdown()
        while self._pending:  # every event, the ends held for later frames too
            self._flush()

    # -- engine thread
    def _on_engine_event(self, event: ev.Event) -> None:
        with self._lock:
            was_empty = not self._pending
            self._pending.append(event)
        if was_empty:
            self._wake.emit()

    # -- GUI thread
    def _on_wake(self) -> None:
        wait = self._last_flush + self.pacer.interval - time.perf_counter()
        if wait <= 0:
            self._flush()
        elif not self._timer.isActive():
            self._timer.start(max(1, int(wait * 1000)))

    def _flush(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        self._last_flush = time.perf_counter()
        if not events:
            return
        self.flushes += 1
        now, held, steady = self._for_this_frame(events)
        deltas: dict[tuple[int, int], list] = {}  # (session, turn) -> [text, tokens], in arrival order
        shown = set()  # the turns this frame draws
        for i, e in enumerate(now):
            if isinstance(e, ev.TokenDelta):
                acc = deltas.setdefault((e.session_id, e.turn_id), ["", 0])
                acc[0] += e.text
                acc[1] += len(e.token_ids)
                shown.add((e.session_id, e.turn_id))
                continue
            self._emit_deltas(deltas, e.session_id)
            self._emit(e)
            if isinstance(e, (ev.Finished, ev.Error)):
                self._drawn_at.pop((e.session_id, e.turn_id), None)
            if isinstance(e, ev.Finished):
                steady = False
                if any(isinstance(after, ev.Finished) for after in now[i + 1:]):
                    order = {id(x): k for k, x in enumerate(events)}  # the next answer ends in the next frame
                    held = sorted(now[i + 1:] + held, key=lambda x: order[id(x)])
                    break
        self._emit_deltas(deltas, None)
        # measured where the frame is the answers' next words only: a first or a last render is a one-off (a new
        # document, a whole code block highlighted), and an interval from it held the other columns' first words back
        self.pacer.frame_started(self._last_flush, len(shown) if steady else 0)
        if held:
            self._hold(held)

    def _for_this_frame(self, events: list[ev.Event]) -> tuple[list[ev.Event], list[ev.Event], bool]:
        """`events` split into those this frame sends and those of sessions whose new text waits for a later one; and
        whether every answer it draws was drawn before."""
        drawn, fresh = self._answers_drawn(events)
        now, held, later = [], [], set()
        for e in events:
            session = getattr(e, "session_id", None)
            if session in later or (isinstance(e, ev.TokenDelta) and (e.session_id, e.turn_id) not in drawn):
                later.add(session)
                held.append(e)
            else:
                now.append(e)
        return now, held, not fresh

    def _answers_drawn(self, events: list[ev.Event]) -> tuple[set[tuple[int, int]], bool]:
        """The turns whose new text this drain draws: all of them, or as many as the frame budget holds, those drawn
        longest ago first (4 compare columns drawn in one frame stalled the window ~50 ms a frame under load); a turn's
        first text goes out whatever the budget."""
        turns = list(dict.fromkeys((e.session_id, e.turn_id) for e in events if isinstance(e, ev.TokenDelta)))
        fresh = [turn for turn in turns if turn not in self._drawn_at]  # first words at once: columns start together
        drawn = fresh + sorted((turn for turn in turns if turn in self._drawn_at), key=self._drawn_at.get)[
            :max(0, self.pacer.answers_per_frame - len(fresh))]
        now = time.perf_counter()
        self._drawn_at.update((turn, now) for turn in drawn)
        return set(drawn), bool(fresh)

    def _hold(self, events: list[ev.Event]) -> None:
        """`events` go out at the next frame, before any that came since."""
        with self._lock:
            self._pending[:0] = events
        self._timer.start(max(1, int(self.pacer.interval * 1000)))

    def _emit_deltas(self, deltas: dict, session_id: int | None) -> None:
        for key in [k for k in deltas if session_id is None or k[0] == session_id]:
            text, tokens = deltas.pop(key)
            self.text_arrived.emit(key[0], key[1], text, tokens)

    def _emit(self, e: ev.Event) -> None:
        match e:
            case ev.Started():
                self.turn_started.emit(e.session_id, e.turn_id)
            case ev.Queued():
                self.turn_queued.emit(e.session_id, e.turn_id, e.position)
            case ev.Finished():
                self.turn_finished.emit(e.session_id, e.turn_id, e.reason, e.text, e.stats)
            case ev.Error():
                self.turn_failed.emit(e.session_id if e.session_id is not None else -1, e.turn_id, e.message,
                                      e.code or "")
            case ev.ContextUsage():
                self.context_usage.emit(e.session_id, e.used, e.limit, e.dropped_messages)
            case ev.ModelProgress():
                self.model_progress.emit(e.model_id, e.stage, e.fraction)
            case ev.ModelLoaded():
                self.model_loaded.emit(e.model_id, e.name, e.info)
            case ev.ModelUnloaded():
                self.model_unloaded.emit(e.model_id)
            case ev.ModelFailed():
                self.model_failed.emit(e.model_id, e.message)
