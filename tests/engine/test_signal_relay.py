"""A termination signal taken by a thread other than the main one still runs its handler at once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli.signal_relay import handled_in_main_thread

ROOT = Path(__file__).resolve().parents[2]


class _Handled(Exception):
    pass


def _raise(signum, _frame) -> None:
    raise _Handled(signum)


def _from_another_thread(signum: int, after_s: float) -> None:
    def send() -> None:
        time.sleep(after_s)
        signal.pthread_kill(threading.get_ident(), signum)  # to this thread: the kernel's other choice

    threading.Thread(target=send, daemon=True).start()


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="POSIX threads' signals")
def test_a_signal_another_thread_took_interrupts_the_main_threads_wait():
    """Without the relay the handler waits for the main thread's next bytecode: here, the end of a 5 s sleep."""
    start = time.monotonic()
    with pytest.raises(_Handled):
        with handled_in_main_thread({signal.SIGUSR1: _raise}):
            _from_another_thread(signal.SIGUSR1, 0.1)
            time.sleep(5)
    assert time.monotonic() - start < 2


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="POSIX threads' signals")
def test_a_signal_is_handled_once():
    """The main thread is interrupted with another signal, never sent the same one again: one Ctrl-C stays one
    KeyboardInterrupt (a second one, mid-answer, would end `parley chat` instead of stopping the answer)."""
    calls = []
    with handled_in_main_thread({signal.SIGUSR1: lambda signum, _frame: calls.append(signum)}):
        _from_another_thread(signal.SIGUSR1, 0.05)
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            time.sleep(0.05)
    assert calls == [signal.SIGUSR1]


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="POSIX threads' signals")
def test_the_handlers_and_wakeup_pipe_before_are_put_back():
    before, poke = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGURG)
    with handled_in_main_thread({signal.SIGUSR1: _raise}):
        assert signal.getsignal(signal.SIGUSR1) is not before
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGURG)) == (before, poke)
    assert signal.set_wakeup_fd(-1) == -1  # no pipe left behind, none closed under someone else


def _sigint_default() -> None:
    """SIGINT as a shell at a terminal leaves it: CI runs the tests in the background, where it is ignored (and an
    ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


PROMPT = """
import signal, sys, threading, time
from cli.terminal import _line_editing, settings_kept
_line_editing()
def send():
    time.sleep(0.3)
    signal.pthread_kill(threading.get_ident(), signal.{name})
with settings_kept(sys.stdin):
    threading.Thread(target=send, daemon=True).start()
    input("> ")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="a terminal of its own")
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_at_the_readline_prompt_ends_the_process_whichever_thread_took_it(name):
    """`parley chat` at its prompt ignored a SIGTERM or Ctrl-C the kernel gave to a library's thread (numpy's BLAS
    server, tqdm's monitor) until a key was pressed: readline's select() is left only by a signal to the main thread.
    (Python ends a process that a KeyboardInterrupt left by SIGINT.)"""
    import pty
    import termios

    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-c", PROMPT.format(name=name)], env=env, cwd=ROOT, stdin=slave, stdout=slave,
                            stderr=slave, start_new_session=True, preexec_fn=_sigint_default)
    try:
        assert proc.wait(timeout=15) == -getattr(signal, name)
        assert termios.tcgetattr(slave)[3] & termios.ECHO
    finally:
        proc.kill()
        os.close(master)
        os.close(slave)
