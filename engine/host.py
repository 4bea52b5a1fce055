"""ModelHost: what the engine needs of a model, local (our runtime) or remote (an HTTP endpoint).

The engine keeps sessions and routes commands; a host runs the turns of the sessions on its model and
reports through events. Every method runs on the engine thread.
"""
from __future__ import annotations

from typing import Callable, Protocol


from engine import events as ev
from engine.session import Session, TurnRequest

Emit = Callable[[ev.Event], None]


class ModelHost(Protocol):
    model_id: int

    def info(self) -> dict: ...

    def start_turn(self, session: Session, turn_id: int, request: TurnRequest) -> None:
        """Starts the turn (emits Started); raises ParleyError, with the reason, when it cannot start."""

    def cancel(self, session: Session) -> None:
        """Ends the session's running turn with reason `cancelled`."""

    def close(self, session: Session) -> None:
        """Ends its running turn (reason `closed`) and gives back what the session held."""

    def fork(self, source: Session, child: Session) -> None:
        """Lets `child` start from what `source` holds (a copy of its cache), where the host can."""

    def has_work(self) -> bool: ...

    def step(self) -> None:
        """Runs one step of everything that is generating, emitting its tokens."""

    def settle(self) -> None:
        """Finishes any step queued ahead, so sessions can be changed."""

    def shutdown(self) -> None:
        """Releases the model (on the engine thread, which owns the device)."""
