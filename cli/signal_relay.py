"""Termination signals handled by the main thread, whichever thread took them and whatever the main thread was doing.

Python runs a signal's handler only in the main thread, between bytecodes. At `parley chat`'s prompt the main thread
sits in readline's select(), which runs pending handlers only when a signal interrupts that very call. Two ways a
SIGTERM (or Ctrl-C's SIGINT) then waited for the next key (the process kept running): the kernel gave it to another
thread that does not block it (numpy's BLAS server, tqdm's monitor, started by libraries), or it came while readline
drew a key just typed, between two select() calls. Python's C handler writes every caught signal to a wakeup pipe from
whatever thread took it; a small thread reads the pipe and interrupts the main thread with SIGURG (a handler that does
nothing: the signal itself is never sent twice, so a Ctrl-C stays one KeyboardInterrupt) until the handler has run.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

POKE_S = 0.05  # how often the main thread is interrupted again while the handler has not run


@contextmanager
def handled_in_main_thread(handlers: dict[int, Callable]) -> Iterator[None]:
    """Each signal's handler set while inside (the ones before put back after), and run promptly. Call it from the
    main thread; elsewhere nothing is set (only the main thread may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) or signal.SIG_DFL for signum in handlers}  # None: set outside Python
    ran = {signum: threading.Event() for signum in handlers}

    def taken(signum, frame) -> None:
        ran[signum].set()
        handlers[signum](signum, frame)

    for signum in handlers:
        signal.signal(signum, taken)
    try:
        with _relay(ran):
            yield
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)


@contextmanager
def _relay(ran: dict[int, threading.Event]) -> Iterator[None]:
    poke = getattr(signal, "SIGURG", None)  # ignored by default and unused here: only there to interrupt a system call
    if poke is None or not hasattr(signal, "pthread_kill"):  # Windows: no threads to signal
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C handler must never block on a full pipe
    previous_poke = signal.signal(poke, _nothing)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    done = threading.Event()  # the context ends: a handler put back before it ran is waited for no longer
    relay = threading.Thread(target=_interrupt_main, args=(read_end, ran, done, threading.main_thread().ident, poke),
                             name="parley-signal-relay", daemon=True)
    relay.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        os.close(write_end)  # the relay's read then ends
        relay.join(timeout=1)
        os.close(read_end)
        signal.signal(poke, previous_poke if previous_poke is not None else signal.SIG_DFL)


def _nothing(_signum, _frame) -> None:
    pass


def _interrupt_main(read_end: int, ran: dict[int, threading.Event], done: threading.Event, main: int,
                    poke: int) -> None:
    """Interrupted, the main thread's select() returns EINTR and Python runs every handler pending, this one's too."""
    while chunk := os.read(read_end, 64):
        for signum in set(chunk) & ran.keys():
            while not ran[signum].is_set() and not done.is_set():
                signal.pthread_kill(main, poke)
                ran[signum].wait(POKE_S)
