"""Commands: what callers ask of the engine thread, one small dataclass each, carrying the session it is about.

A command that fails is reported to its own session (and turn): `session_id` and `turn_id` say which.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engine.session import TurnRequest


@dataclass(frozen=True, slots=True)
class Command:
    session_id: int | None = None
    turn_id: int | None = None


@dataclass(frozen=True, slots=True)
class LoadModel(Command):
    model_id: int = 0
    source: Path = Path()


@dataclass(frozen=True, slots=True)
class AddHost(Command):
    """A model host that another thread made ready (a remote endpoint that answered its probe)."""

    model_id: int = 0
    host: Any = None
    name: str = ""
    info: dict | None = None


@dataclass(frozen=True, slots=True)
class OpenSession(Command):
    model_id: int = 0
    overflow: str = "stop"
    raw: bool = False


@dataclass(frozen=True, slots=True)
class StartTurn(Command):
    request: TurnRequest | None = None


@dataclass(frozen=True, slots=True)
class Cancel(Command):
    pass


@dataclass(frozen=True, slots=True)
class Fork(Command):
    source_id: int = 0  # the session whose cache the new one (session_id) starts from


@dataclass(frozen=True, slots=True)
class Close(Command):
    pass


@dataclass(frozen=True, slots=True)
class Post(Command):
    """Runs fn(*args) on the engine thread: worker threads hand their results back this way."""

    fn: Callable[..., None] | None = None
    args: tuple = ()


@dataclass(frozen=True, slots=True)
class Call(Command):
    fn: Callable[[Any], Any] | None = None
    future: Future | None = None


@dataclass(frozen=True, slots=True)
class UnloadModel(Command):
    model_id: int = 0


@dataclass(frozen=True, slots=True)
class Shutdown(Command):
    pass
