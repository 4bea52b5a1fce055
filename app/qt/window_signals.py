"""Ctrl-C (or SIGTERM) sent to the window's process closes the window as its close button does.

Qt's loop waits in C and runs Python only inside callbacks, so Python's KeyboardInterrupt went off in whichever override
ran next (a traceback from app/qt/drops.py's eventFilter) and was swallowed there: `make run`'s window stayed open, and
a first run stopped that way went on building the kernels. Here the signal's byte wakes the loop through a socket, the
handler asks for the close from the loop (never from inside the code it interrupted), and a second Ctrl-C or SIGTERM
ends the process at once, for a close that waits on a busy engine.
"""
from __future__ import annotations

import signal
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from PySide6.QtCore import QSocketNotifier, QTimer

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(slots=True)
class Ending:
    signum: int | None = None  # the signal that closed the window; None while none came

    @property
    def exit_code(self) -> int | None:
        """128 + the signal, as a shell reports a process it ended (130 for Ctrl-C); None where none came."""
        return None if self.signum is None else 128 + self.signum


@contextmanager
def closed_by_signals(qapp) -> Iterator[Ending]:
    """Inside, SIGINT and SIGTERM close `qapp`'s windows (the handlers and wakeup descriptor before are put back
    after). Call it from the main thread with the QApplication made; elsewhere nothing is set."""
    ending = Ending()
    if threading.current_thread() is not threading.main_thread():
        yield ending
        return
    read_end, write_end = socket.socketpair()
    for end in (read_end, write_end):
        end.setblocking(False)
    notifier = QSocketNotifier(read_end.fileno(), QSocketNotifier.Type.Read)
    notifier.activated.connect(lambda *_: _drain(read_end))  # Python runs the handler before this slot's first line

    def handle(signum, frame) -> None:
        if ending.signum is not None:  # the close is under way and the user insists
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        ending.signum = signum
        QTimer.singleShot(0, qapp.closeAllWindows)  # the close button's way out: drafts and window saved

    previous = {signum: signal.signal(signum, handle) for signum in SIGNALS}
    previous_fd = signal.set_wakeup_fd(write_end.fileno(), warn_on_full_buffer=False)
    try:
        yield ending
    finally:
        signal.set_wakeup_fd(previous_fd)
        for signum, action in previous.items():
            signal.signal(signum, action if action is not None else signal.SIG_DFL)
        notifier.setEnabled(False)
        read_end.close()
        write_end.close()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(64):
            pass
    except OSError:  # empty (BlockingIOError) or closed
        pass
