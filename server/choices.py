"""One request's answers: a session per choice (`n` for each prompt), their events in one queue, batched in the same
engine steps."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from engine import events as ev
from server.bridge import ServedModel, ServerBridge


class Choices:
    """The sessions of one request, choice i the i-th opened. Events read before every choice had started wait in
    `held`, so none is lost while the request waits for its last choice's verdict.

    At most `window` choices are submitted at once (None: all): the engine admits turns in the order they come, so a
    request of n=128 submitted whole took every slot until its last answer began, and a request sent after it waited
    65 s for 4 tokens (tiny Qwen3, 8 slots, 255 tokens each). The rest are submitted one as another ends (`ended`),
    behind the turns other requests sent meanwhile."""

    def __init__(self, bridge: ServerBridge, window: int | None = None):
        self.bridge = bridge
        self.queue: asyncio.Queue = asyncio.Queue()
        self.sids: list[int] = []
        self.held: deque[ev.Event] = deque()
        self.window = window
        self.submitted, self.finished = 0, 0  # choices whose turns were handed to the engine, and have ended
        self._later: deque[tuple[int, Callable[[], None]]] = deque()  # the others' sessions and submissions

    @property
    def n(self) -> int:
        return len(self.sids)

    def open(self, model: ServedModel, raw: bool) -> int:
        sid, _ = self.bridge.open(model, raw, self.queue)
        self.sids.append(sid)
        return sid

    def submit(self, sid: int, start: Callable[[], None], now: bool = False) -> None:
        """Hands session `sid`'s turn to the engine (`start`) if the window has room or `now`, else keeps it for later
        (counted as queued by /health meanwhile)."""
        if now or self.window is None or self.submitted - self.finished < self.window:
            self.submitted += 1
            start()
        else:
            self.bridge.hold(sid, True)
            self._later.append((sid, start))

    def ended(self) -> None:
        """A choice's turn ended (its Finished read): the next kept one is submitted."""
        self.finished += 1
        if self._later:
            sid, start = self._later.popleft()
            self.bridge.hold(sid, False)
            self.submitted += 1
            start()

    def index(self, session_id: int) -> int:
        return self.sids.index(session_id)

    def stop(self, i: int) -> None:
        """Ends choice i's turn where it is (its Finished still comes)."""
        self.bridge.engine.cancel(self.sids[i])

    def close(self) -> None:
        """Ends every choice's turn still running (a client that went away) and frees their caches."""
        self._later.clear()
        for sid in self.sids:
            self.bridge.close(sid)
