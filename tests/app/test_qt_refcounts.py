"""The installed PySide6 keeps the reference counts of None and True: on Python 3.11, PySide6 6.12.0 dropped one on
every void call and every signal emitted, and the app aborted ("none_dealloc") after a few thousand streamed tokens.
pyproject.toml keeps that version out; this fails on any build that does it again. (On Python 3.12 and newer None
and True are immortal and their counts never move.)"""
from __future__ import annotations

import sys

from PySide6.QtCore import QCoreApplication, QObject, Signal
from PySide6.QtWidgets import QLabel

CALLS = 500


class _Emitter(QObject):
    fired = Signal(int)


def _drift(call) -> tuple[int, int]:
    """How the counts of None and True moved over CALLS calls."""
    before = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(CALLS):
        call()
    return sys.getrefcount(None) - before[0], sys.getrefcount(True) - before[1]


def test_streaming_calls_keep_none_and_true(qapp):
    label, emitter = QLabel(), _Emitter()
    emitter.fired.connect(lambda n: None)
    calls = {"setText": lambda: label.setText("token"), "setVisible": lambda: label.setVisible(False),
             "emit": lambda: emitter.fired.emit(1), "processEvents": QCoreApplication.processEvents}
    # a few references come and go with caches; a lost one a call is CALLS lost
    lost = {name: drift for name, call in calls.items() if min(drift := _drift(call)) < -CALLS // 10}
    assert not lost, f"PySide6 loses references to (None, True) per {CALLS} calls: {lost}"
