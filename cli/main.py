"""The `parley` command: the desktop app (no subcommand), generate and chat (terminal), serve (HTTP API)."""
from __future__ import annotations

import argparse
import os
import sys
import threading

from cli.memory_floor import refuse_below_floor

refuse_below_floor()  # before the imports below, which die under so low a limit with a traceback or an abort

from app.core.version import version_line  # noqa: E402
from cli.paths import Paths, data_dir_arg, keep_kernels_under  # noqa: E402
from cli.serve import add_serve_parser  # noqa: E402
from cli.terminal import add_terminal_parsers, printable  # noqa: E402
from engine.errors import ParleyError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    closed = _closed_streams_as_null()
    _tolerant_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _app_flags_alone(args)
        if "stdout" in closed and args.command in ("generate", "chat"):  # before the model loads
            raise ParleyError("standard output is closed (>&-): the answer would have nowhere to go")
        return args.func(args)
    except ParleyError as exc:  # its text may quote a file or an endpoint: escape sequences shown, not run
        print(f"parley: {printable(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `parley generate | head -1`: the reader has gone, which is no error of ours to report
        _quiet_stdout()
        return 141  # as a process SIGPIPE ends (128 + 13), which a shell's pipefail reads as usual
    except KeyboardInterrupt:
        if sys.stdout.isatty():  # a streamed answer cut short: the shell's prompt on a line of its own
            print()
        if argv is None:  # the process's own command line: the process is ours to end
            _end_if_workers_busy(130)
        return 130


def _app_flags_alone(args: argparse.Namespace) -> None:
    """`parley --self-test serve` served and `parley --theme dark chat` chatted, the app's flag unread."""
    for flag, given in (("--self-test", args.self_test), ("--theme", args.theme is not None)):
        if given and args.command:
            raise ParleyError(f"argument {flag}: it is the app's (parley without a subcommand); "
                              f"parley {args.command} does not read it")


def _closed_streams_as_null() -> list[str]:
    """A stream the shell closed (`<&-`, `>&-`, `2>&-`) is None in Python: its first read or write was an
    AttributeError traceback. Each is /dev/null instead (a closed stdin reads as empty); their names are returned."""
    closed = [name for name in ("stdin", "stdout", "stderr") if getattr(sys, name) is None]
    for name in closed:
        setattr(sys, name, open(os.devnull, "r" if name == "stdin" else "w", encoding="utf-8"))
    return closed


def _tolerant_streams() -> None:
    """Text the terminal's encoding cannot hold (an emoji under PYTHONIOENCODING=latin-1 or ascii) is written escaped
    and input it cannot decode is kept as escapes (see cli.terminal.typed): both raised mid-answer, a traceback."""
    # surrogateescape too: an ASCII locale Python did not switch to UTF-8 gives stdout that, which still raises
    for stream, weak, errors in ((sys.stdout, ("strict", "surrogateescape"), "backslashreplace"),
                                 (sys.stdin, ("strict",), "surrogateescape")):
        if getattr(stream, "errors", None) in weak and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=errors)


def _quiet_stdout() -> None:
    """Standard output onto /dev/null: the interpreter's last flush into the closed pipe would print its traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _end_if_workers_busy(code: int) -> None:
    """Ends the process at once where a worker thread is still inside torch (Ctrl-C during a load): the interpreter's
    teardown under a running C++ thread aborts ("terminate called without an active exception", exit 134)."""
    if any(t.is_alive() for t in threading.enumerate() if t is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="parley", description="Chat with local language models.")
    p.add_argument("--version", action="version", version=version_line())
    p.add_argument("--data-dir", type=data_dir_arg, help="keep all data here (default: the platform's user folders, or $PARLEY_HOME)")
    p.add_argument("--self-test", action="store_true", help="open the window offscreen, stream two chats at once, exit 0 if both answer")
    p.add_argument("--theme", choices=["system", "light", "dark"], default=None,
                   help="the GUI's colours for this launch, not saved (default: the saved setting)")
    p.set_defaults(func=gui)
    sub = p.add_subparsers(dest="command")
    add_terminal_parsers(sub)
    add_serve_parser(sub)
    for command in sub.choices.values():  # `parley serve --version` was an unrecognized argument
        command.add_argument("--version", action="version", version=version_line())
    return p


def gui(args: argparse.Namespace) -> int:
    """No subcommand: the desktop app on the embedded default model (or its headless self-test)."""
    keep_kernels_under(Paths.resolve(args.data_dir))  # as every command does (cli.options.paths_of)
    if args.self_test:
        from app.qt.self_test import run

        return run(args.data_dir, args.theme)
    from app.qt.main import qt_app, run_gui
    from app.qt.window_signals import closed_by_signals

    with closed_by_signals(qt_app()) as ending:  # Ctrl-C in `make run`'s terminal closes the window
        code = run_gui(args.data_dir, args.theme)
    return ending.exit_code or code


if __name__ == "__main__":
    sys.exit(main())
