"""`parley generate` and `parley chat` as a user drives them from a shell: a pipe closed early, a terminal's
Ctrl-D, a signal mid-answer."""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PARLEY_HOME": str(tmp_path / "home"), "TERM": "xterm"}


def test_a_pipe_closed_before_the_output_is_no_traceback(tiny_models, tmp_path):
    """`parley generate ... | head -1`: the reader gone, the next write raised BrokenPipeError, a traceback."""
    args = [sys.executable, "-m", "cli.main", "generate", "--model", str(tiny_models["qwen3"].gguf_path),
            "--prompt", "a", "--prompt", "b", "--max-tokens", "2", "--json"]
    proc = subprocess.Popen(args, env=_env(tmp_path), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves before the first line: every write meets a closed pipe
    _, err = proc.communicate(timeout=120)
    assert err.decode() == ""
    assert proc.returncode == 141


def _read_until(fd: int, marker: bytes, timeout: float = 60.0, seen: bytes = b"") -> bytes:
    """What `fd` gives until `marker` (a regular expression) shows after `seen`, or `timeout` seconds pass."""
    import re
    import select
    import time

    out, end = b"", time.monotonic() + timeout
    while not re.search(marker, seen + out) and time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            out += os.read(fd, 4096)
    return out


def _ctrl_c_as_at_a_terminal() -> None:
    """SIGINT as a shell at a terminal leaves it: CI's tests run under make in the background, which ignores it, and an
    ignored SIGINT stays ignored across exec."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def _chat_in_a_pty(args: list[str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int, int]]:
    """`parley chat` (`args`) at a terminal of its own: (the process, the terminal's master and slave ends)."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(args, env=_env(tmp_path), cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=_ctrl_c_as_at_a_terminal)
    try:
        yield proc, master, slave
    finally:
        proc.kill()
        os.close(master)
        os.close(slave)


def _answering(slave: int, timeout: float = 30.0) -> bool:
    """Waits until `parley chat` streams an answer: keys not echoed but lines still cooked (at its prompt readline's raw
    mode has neither). The tiny model's answer lasts ~0.5 s (773 tok/s, 512 tokens of context): a fixed wait missed it."""
    import termios
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lflag = termios.tcgetattr(slave)[3]
        if lflag & termios.ICANON and not lflag & termios.ECHO:
            return True
        time.sleep(0.001)
    return False


def test_a_signal_mid_answer_leaves_the_terminal_echoing(tiny_models, tmp_path):
    """`kill PID` while `parley chat` answered: it died with the terminal's echo off (the shell then showed no keys)."""
    import signal
    import termios

    args = [sys.executable, "-m", "cli.main", "chat", "--model", str(tiny_models["qwen3"].gguf_path),
            "--max-tokens", "100000", "--temperature", "1", "--seed", "1", "--device", "cpu"]
    with _chat_in_a_pty(args, tmp_path) as (proc, master, slave):
        assert b"> " in _read_until(master, b"> ")
        os.write(master, b"hello\n")
        assert _answering(slave), "no answer streamed: no test"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
        assert termios.tcgetattr(slave)[3] & termios.ECHO


def test_ctrl_c_mid_answer_stops_the_answer_and_the_chat_goes_on(tiny_models, tmp_path):
    """One Ctrl-C stops the answer ("stopped") and the prompt comes back; Ctrl-D then ends the chat as usual."""
    import signal

    args = [sys.executable, "-m", "cli.main", "chat", "--model", str(tiny_models["qwen3"].gguf_path),
            "--max-tokens", "100000", "--temperature", "1", "--seed", "1", "--device", "cpu"]
    with _chat_in_a_pty(args, tmp_path) as (proc, master, slave):
        _read_until(master, b"> ")
        os.write(master, b"hello\n")
        assert _answering(slave), "no answer streamed: no test"
        proc.send_signal(signal.SIGINT)
        assert b"stopped" in _read_until(master, rb"stopped.*\n.*> ", 30)
        assert proc.poll() is None
        os.write(master, b"\x04")
        assert proc.wait(timeout=60) == 0


def _chat_at_a_terminal(tiny_models, tmp_path: Path, typed: bytes) -> bytes:
    """What `parley chat` shows at a terminal where `typed` is typed at the first prompt and Ctrl-D at the next."""
    with _chat_in_a_pty(_chat_args(tiny_models), tmp_path) as (proc, master, _):
        shown = _read_until(master, b"> ")
        start = len(shown)
        for i in range(0, len(typed), 512):  # as a terminal passes a paste on: a piece at a time
            os.write(master, typed[i:i + 512])
            shown += _read_until(master, b"\x00", 0.05)
        # the answer or the error, then the next prompt
        shown += _read_until(master, rb"\r\n(\x1b\[\?2004h)?> ", seen=shown[start:])
        os.write(master, b"\x04")
        assert proc.wait(timeout=60) == 0
        return shown + _read_until(master, b"\x00", 0.5)


def _chat_args(tiny_models) -> list[str]:
    return [sys.executable, "-m", "cli.main", "chat", "--model", str(tiny_models["qwen3"].gguf_path),
            "--max-tokens", "1", "--device", "cpu"]


def _tokens_needed(shown: bytes) -> bytes:
    import re

    return re.search(rb"needs ([\d,]+) tokens", shown).group(1)


def test_a_line_longer_than_the_terminal_holds_reaches_the_model_whole(tiny_models, tmp_path):
    """A terminal's line discipline keeps 4,095 characters of a line: a longer paste was cut there, unsaid."""
    line = " ".join(f"w{i}" for i in range(1500)).encode()  # 7,389 characters: past the tiny model's context too
    piped = subprocess.run(_chat_args(tiny_models), env=_env(tmp_path), cwd=ROOT, input=line + b"\n",
                           capture_output=True, timeout=120)
    assert piped.returncode == 0, piped.stderr.decode()
    pasted = b"\x1b[200~" + line + b"\x1b[201~\r"  # as a terminal pastes (bracketed), then Enter
    shown = _chat_at_a_terminal(tiny_models, tmp_path, pasted)
    assert _tokens_needed(shown) == _tokens_needed(piped.stderr)  # the overflow error counts what arrived


def test_ctrl_d_at_the_prompt_ends_the_line(tiny_models, tmp_path):
    """Ctrl-D at "> " quit without a newline: the shell's prompt went on after "> "."""
    assert _chat_at_a_terminal(tiny_models, tmp_path, b"hi\r").endswith(b"> \r\n")


def test_a_signal_at_the_prompt_leaves_the_terminal_echoing(tiny_models, tmp_path):
    """`kill PID` while a line was half typed: readline's raw mode (echo off) outlived the process."""
    import signal
    import termios

    with _chat_in_a_pty(_chat_args(tiny_models), tmp_path) as (proc, master, slave):
        _read_until(master, b"> ")
        os.write(master, b"half a li")
        _read_until(master, b"half a li", 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == -signal.SIGTERM
        assert termios.tcgetattr(slave)[3] & termios.ECHO


def test_termination_signals_go_to_the_main_thread():
    """The engine's threads block SIGTERM/SIGHUP/SIGQUIT/SIGINT, so the kernel hands them to the main thread, the one
    that runs Python's handlers: taken by the engine thread, a SIGTERM at `parley chat`'s prompt waited for a key."""
    import signal

    from engine.engine import Engine

    engine = Engine().start()
    try:
        blocked = engine.call(lambda _: signal.pthread_sigmask(signal.SIG_BLOCK, []))
        assert {signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT} <= blocked
        assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the main thread's is as it was
    finally:
        engine.shutdown()


def test_echo_goes_off_and_comes_back_only_while_the_signal_handlers_are_set(monkeypatch):
    """A SIGTERM between echo going off and the handlers being set (or after they went, before echo came back) left
    the user's shell showing no keys typed: every change of the terminal's settings happens under the handlers."""
    import pty
    import signal
    import termios

    from cli.terminal import keys_held_back

    master, slave = pty.openpty()
    calls, real = [], termios.tcsetattr
    outside = signal.getsignal(signal.SIGTERM)

    def recorded(fd, when, attrs):
        calls.append((bool(attrs[3] & termios.ECHO), signal.getsignal(signal.SIGTERM) is not outside))
        real(fd, when, attrs)

    monkeypatch.setattr(termios, "tcsetattr", recorded)
    try:
        with open(slave, "r", closefd=False) as stream, keys_held_back(stream):
            assert not termios.tcgetattr(slave)[3] & termios.ECHO
        assert calls == [(False, True), (True, True)]  # (echo on, under Parley's handler) for off, then back on
        assert signal.getsignal(signal.SIGTERM) is outside and termios.tcgetattr(slave)[3] & termios.ECHO
    finally:
        os.close(master)
        os.close(slave)
