"""One request's answers: a session per choice (`n` for each prompt), their events in one queue, batched in the same
engine steps."""
from __future__ import annotations

import asyncio
from collections import deque

from engine import events as ev
from server.bridge import ServedModel, ServerBridge


class Choices:
    """The sessions of one request, choice i the i-th opened. Events read before every choice had started wait in
    `held`, so none is lost while the request waits for its last choice's verdict."""

    def __init__(self, bridge: ServerBridge):
        self.bridge = bridge
        self.queue: asyncio.Queue = asyncio.Queue()
        self.sids: list[int] = []
        self.held: deque[ev.Event] = deque()

    @property
    def n(self) -> int:
        return len(self.sids)

    def open(self, model: ServedModel, raw: bool) -> int:
        sid, _ = self.bridge.open(model, raw, self.queue)
        self.sids.append(sid)
        return sid

    def index(self, session_id: int) -> int:
        return self.sids.index(session_id)

    def stop(self, i: int) -> None:
        """Ends choice i's turn where it is (its Finished still comes)."""
        self.bridge.engine.cancel(self.sids[i])

    def close(self) -> None:
        """Ends every choice's turn still running (a client that went away) and frees their caches."""
        for sid in self.sids:
            self.bridge.close(sid)
