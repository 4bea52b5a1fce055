"""Signal: a plain observer with Qt's connect/emit shape, so the app's logic runs and tests without Qt.

Declared on a class like Qt's (`changed = Signal(int)`), each instance gets its own list of listeners.
Listeners are called at once, on the emitting thread: the core is only driven from the GUI thread (the
Qt bridge delivers engine events there), so this behaves like a direct Qt connection.
"""
from __future__ import annotations

from typing import Any, Callable


class BoundSignal:
    def __init__(self) -> None:
        self._slots: list[Callable[..., Any]] = []

    def connect(self, slot: Callable[..., Any]) -> None:
        self._slots.append(slot)

    def disconnect(self, slot: Callable[..., Any]) -> None:
        self._slots.remove(slot)

    def emit(self, *args: Any) -> None:
        for slot in list(self._slots):
            slot(*args)


class Signal:
    def __init__(self, *types: type):
        self.types = types  # documentation only, as with Qt's Signal(int, str)
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = "_signal_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> "BoundSignal | Signal":
        if obj is None:
            return self
        bound = obj.__dict__.get(self._name)
        if bound is None:
            bound = obj.__dict__[self._name] = BoundSignal()
        return bound
