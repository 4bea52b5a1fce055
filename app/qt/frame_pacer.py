"""FramePacer: how often the bridge drains engine events, and how many answers' text a drain draws, from what the last
frames cost.

A drain's token deltas are drawn by every chat view showing them (4 compare columns: 4 documents edited, laid out and
painted: ~4 ms each on a 2-core Xeon, 10-15 ms under load), and that happens after the drain, when Qt delivers the
window's update request. A marker event posted at a priority below that request reaches the pacer once the frame is
drawn: its wait is the frame's cost. A drain then draws as many answers as fit in FRAME_BUDGET_S (at least one; those
drawn longest ago first, the others' tokens merged into a later drain), and the next drain comes no sooner than the
frame's cost over BUSY_SHARE: the frame budget, not the token count, decides how often a view redraws.
"""
from __future__ import annotations

import time

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt

FRAME_BUDGET_S = 1 / 60  # the drawing of one drain: a longer stall is felt as a key or scroll that lags
BUSY_SHARE = 0.5  # at most this share of the GUI thread's time goes to drawing streamed text; the rest is the user's
SMOOTHING = 0.5  # weight of the newest frame: one slow frame does not halve the rate at once
MAX_INTERVAL_S = 0.25  # drains come at least 4 times a second however slow the frames are
MARK_PRIORITY = Qt.EventPriority.LowEventPriority.value - 1  # after the update request (low priority) of the same pass


class FramePacer(QObject):
    """`frame_started()` at each drain; `interval` is the least time from one drain to the next and
    `answers_per_frame` how many answers' text one drain draws."""

    def __init__(self, frame_s: float, parent: QObject | None = None):
        super().__init__(parent)
        self.frame_s = frame_s
        self.cost_s = 0.0  # a drain's frame, smoothed
        self.answer_s = 0.0  # one answer's share of it, smoothed
        self._mark_type = QEvent.Type(QEvent.registerEventType())
        self._started: tuple[float, int] | None = None  # the frame being measured: when, and how many answers

    @property
    def interval(self) -> float:
        return min(MAX_INTERVAL_S, max(self.frame_s, self.cost_s / BUSY_SHARE))

    @property
    def answers_per_frame(self) -> int:
        return max(1, int(FRAME_BUDGET_S / self.answer_s)) if self.answer_s else 1_000

    def frame_started(self, started: float, answers: int) -> None:
        """A drain that began at `started` (time.perf_counter()) sent the new text of `answers` answers: its frame is
        measured until the marker posted now comes back (one frame at a time; a drain that draws none is not)."""
        if self._started is not None or not answers:
            return
        self._started = (started, answers)
        QCoreApplication.postEvent(self, QEvent(self._mark_type), MARK_PRIORITY)

    def event(self, e: QEvent) -> bool:  # noqa: D102 (Qt's)
        if e.type() != self._mark_type:
            return super().event(e)
        (started, answers), self._started = self._started, None
        cost = time.perf_counter() - started
        self.cost_s, self.answer_s = _smoothed(self.cost_s, cost), _smoothed(self.answer_s, cost / answers)
        return True


def _smoothed(old: float, new: float) -> float:
    """The newest value weighed in; the first taken as it is (averaged with no cost yet, it halved the first)."""
    return SMOOTHING * new + (1 - SMOOTHING) * old if old else new
