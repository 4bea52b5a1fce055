"""`parley generate` and `parley chat`: the engine from a terminal, on a blocking client of its thread."""
from __future__ import annotations

import argparse
import json
import os
import sys
import unicodedata
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from cli.prompts import PromptBound, add_prompt_options, read_line, read_prompts
from cli.options import (add_context_option, add_engine_options, add_sampling_options, context_capped, engine_config,
                         paths_of, sampling_params, session_tokens)
from cli.load_bar import TICK_S, LoadBar
from cli.signal_relay import handled_in_main_thread
from engine.errors import ParleyError

if TYPE_CHECKING:  # they bring torch (1.2 s): imported where a model loads, so `parley --help` answers at once
    from engine import events as ev


def add_terminal_parsers(sub) -> None:
    g = sub.add_parser("generate", help="complete one or more prompts")
    add_engine_options(g)
    add_sampling_options(g)
    add_prompt_options(g)
    add_context_option(g, "of each prompt")
    g.add_argument("--max-tokens", type=int, default=128, help="the most tokens of each answer (default: 128)")
    g.add_argument("--raw", action="store_true", help="BOS + text, no chat template")
    g.add_argument("--suffix", default=None, metavar="TEXT",
                   help="fill in the middle: the text after the gap, each prompt the text before it (a code model's "
                   "fill-in-the-middle tokens, no chat template); the answer is what goes between. Empty: none, the prompt completed as "
                   "with --raw (the server's empty suffix)")
    g.add_argument("--json", action="store_true", help="one JSON line per prompt at the end")
    g.add_argument("--sequential", action="store_true", help="run prompts one after another, each in a session of its own (not batched)")
    g.set_defaults(func=generate)
    c = sub.add_parser("chat", help="a conversation in the terminal")
    add_engine_options(c)
    add_sampling_options(c)
    c.add_argument("--max-tokens", type=int, default=512, help="the most tokens of each answer (default: 512)")
    add_context_option(c, "of the conversation, its oldest messages left out to fit")
    c.add_argument("--system", default=None, help="system prompt")
    c.set_defaults(func=chat)


def open_engine(args: argparse.Namespace, max_sessions: int = 8):
    """Starts the engine thread and loads the chosen model on it, with a progress bar on stderr."""
    from cli.engine_cli import EngineCLI
    from cli.engine_flags import Target, check_engine_flags
    from cli.first_run import kernel_build_note
    from engine.loading.default_model import resolve_model

    paths = paths_of(args)
    source = resolve_model(args.model, paths.models)
    target = Target.of(args, [source])
    check_engine_flags(args, target)  # a flag this model or machine ignores: before the load
    cli = EngineCLI(engine_config(args, paths, max_sessions=max_sessions,
                                   max_session_tokens=session_tokens(args)))
    bar = LoadBar(sys.stderr)
    if not bar.shown and (note := kernel_build_note(args, target)):  # a terminal sees the build's stage instead
        print(f"parley: {note}", file=sys.stderr)
    try:
        model_id, loaded = cli.load(source, bar.show, idle=bar.tick, idle_s=TICK_S)
    except BaseException:
        cli.close()
        raise
    finally:
        bar.close()
    context = loaded.info.get("context")
    if context == session_tokens(args):  # not capped by the model's own: it may hold more
        cli.hints["context_length_exceeded"] = f" Or raise --context ({context:,} now), up to the model's own."
    if capped := context_capped(args, printable(loaded.name), context):
        print(f"parley: {capped}", file=sys.stderr)
    for notice in loaded.info.get("notices", []):  # as serve says them, and every other line of ours on stderr
        print(f"parley: {printable(notice)}", file=sys.stderr)
    if getattr(args, "thinking", None) is not None and loaded.info.get("thinking_switch") is False:
        print(f"parley: --thinking {args.thinking} does nothing here: {printable(loaded.name)}'s chat template has no "
              "thinking switch", file=sys.stderr)  # a script may pass it to every model: said, not refused
    return cli, model_id, loaded


def generate(args: argparse.Namespace) -> int:
    raw = "--suffix" if args.suffix is not None else "--raw" if args.raw else None
    if raw and args.thinking is not None:  # the switch is the chat template's: --raw has none to switch
        raise ParleyError(f"argument --thinking: it switches a chat template's thinking; {raw} sends the text "
                          f"without one (leave out --thinking {args.thinking} or {raw})")
    # bad input is one line before the model loads
    params, prompts = sampling_params(args), read_prompts(args, PromptBound(session_tokens(args)))
    cli, model_id, loaded = open_engine(args, max_sessions=len(prompts))
    try:
        _check_fill_in_middle(args, loaded)
        sessions = [cli.engine.open_session(model_id, raw=raw is not None) for _ in prompts]
        stream = not args.json and (len(prompts) == 1 or args.sequential)
        turns: list[int] = []
        try:
            _run_prompts(cli, args, sessions, prompts, params, stream, turns)
            interrupted = False
        except KeyboardInterrupt:  # Ctrl-C mid-answer: what each prompt had written is reported, cut "cancelled"
            _stop_all(cli, sessions, turns)
            if turns:
                _end_line(cli, turns[-1], stream)
            interrupted = True
        failed = [i for i, turn in enumerate(turns) if not _report(cli, i, turn, args.json, stream, len(turns))]
        if args.json:
            print(json.dumps(_load_line(loaded.info), ensure_ascii=False))
    finally:
        cli.close()
    return 130 if interrupted else 2 if failed else 0


def _run_prompts(cli, args: argparse.Namespace, sessions: list[int], prompts: list[str], params, stream: bool,
                 turns: list[int]) -> None:
    """Submits each prompt (one after another with --sequential, else all in one batch) and runs them to their ends;
    `turns` grows as they are submitted, so an interrupted run knows which."""
    on_text = _write if stream else None
    for sid, prompt in zip(sessions, prompts):
        turns.append(cli.engine.submit(sid, [{"role": "user", "content": typed(prompt)}], params,
                                       suffix=typed(args.suffix) if args.suffix else None))
        if args.sequential:
            cli.run(turns[-1:], on_text)
            _end_line(cli, turns[-1], stream)
    cli.run(turns, on_text)
    if not args.sequential:
        _end_line(cli, turns[0], stream)


def _stop_all(cli, sessions: list[int], turns: list[int]) -> None:
    """Every submitted turn stopped where it is (a second Ctrl-C while they stop ends the command at once)."""
    for sid in sessions[:len(turns)]:
        cli.engine.cancel(sid)
    cli.run(turns)


def _check_fill_in_middle(args: argparse.Namespace, loaded) -> None:
    """--suffix on a model with no fill-in-the-middle tokens: one line before any prompt runs (each would fail). An
    empty one asks for none, as the server's `suffix: ""` does: the prompt is completed as a raw document."""
    if args.suffix and not loaded.info.get("fill_in_middle"):
        raise ParleyError(f"argument --suffix: {printable(loaded.name)} was not trained to fill in the middle (its "
                          "vocabulary holds no fill-in-the-middle tokens); a code model that was does, e.g. "
                          "Qwen2.5-Coder, StarCoder2, CodeLlama, DeepSeek-Coder or Codestral")


def _report(cli, i: int, turn: int, as_json: bool, streamed: bool, count: int) -> bool:
    """Prompt i's result on stdout, or its error on stderr (and as its JSON line); one refused prompt of a batch
    loses none of the others' answers. False where it failed."""
    end, error = cli.ended[turn], cli.error(turn)
    if error is not None:
        print(f"parley: {f'prompt {i}: ' if count > 1 else ''}{printable(error)}", file=sys.stderr)
        if as_json:
            print(json.dumps({"prompt": i, "error": error}, ensure_ascii=False))
        return False
    if as_json:
        print(json.dumps({"prompt": i, "token_ids": cli.tokens.get(turn, []), "text": end.text, "reason": end.reason,
                          **_timings(end.stats)}, ensure_ascii=False))
    elif not streamed:
        print(f"--- prompt {i} ({end.reason})\n{safe_output(end.text)}")
    return True


def _end_line(cli, turn, stream: bool) -> None:
    """The streamed answer's line ended; a refused turn streamed nothing, and its error line follows alone."""
    if stream and cli.error(turn) is None:
        print()


def _timings(s) -> dict:
    """The figures users compare with llama.cpp's: time to first token, prefill and decode rates."""
    prefill = s.prefilled_tokens / s.ttft_s if s.ttft_s else None
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
            "ttft_s": _round(s.ttft_s), "prefill_tok_s": _round(prefill), "decode_tok_s": _round(s.tokens_per_s),
            "decode_steps": s.decode_steps, "drafted_tokens": s.drafted_tokens, "accepted_tokens": s.accepted_tokens}


def _load_line(info: dict) -> dict:
    """Sizes in MiB (2**20 bytes) under *_mib; resident_mb (MiB too) and weights_mb (MB, 10**6 bytes, the model's
    info) stay for scripts that read them: side by side they compared two units."""
    from engine.memory import resident_bytes

    resident = round(resident_bytes() / 2**20, 1)
    weights_mb = info.get("weights_mb")
    weights_mib = None if weights_mb is None else round(weights_mb * 1e6 / 2**20, 1)
    return {"load_s": info.get("load_s"), "resident_mib": resident, "weights_mib": weights_mib,
            "resident_mb": resident, "weights_mb": weights_mb, "quantization": info.get("quantization")}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


QUIT_WORDS = ("/bye", "/exit", "/quit")  # Ollama's, and the words people type at a prompt to leave it


def chat(args: argparse.Namespace) -> int:
    from app.core.reasoning import reply_text

    params, messages = sampling_params(args), []  # the conversation is ours; each turn hands it over
    cli, model_id, loaded = open_engine(args, max_sessions=1)
    _line_editing()
    try:
        sid = cli.engine.open_session(model_id, overflow="truncate")
        print(f"Parley — {printable(loaded.name)}. /bye or Ctrl-D to quit.", file=sys.stderr)
        bound = PromptBound(session_tokens(args))  # a piped line is read no further than a message could be
        while True:
            try:
                with settings_kept(sys.stdin):  # readline's raw mode, were a signal to end the process there
                    line = typed(read_line(bound)).strip()
            except EOFError:  # Ctrl-D ends no line: the shell's prompt would follow "> " on the same one
                print(end="\n" if sys.stdin.isatty() else "")
                return 0
            if not line:  # an Enter too many (llama.cpp and Ollama wait for text too): the chat is not thrown away
                continue
            if line in QUIT_WORDS:
                return 0
            messages.append({"role": "user", "content": line})
            turn = cli.engine.submit(sid, messages, params, args.system)
            try:
                with keys_held_back(sys.stdin):
                    try:
                        cli.run([turn], _write)
                    except KeyboardInterrupt:
                        _stop(cli, sid, turn)
            except KeyboardInterrupt:  # Ctrl-C just as the answer began or ended, outside the wait above
                _stop(cli, sid, turn)
            print()
            end, error = cli.ended[turn], cli.error(turn)
            if error is not None:
                messages.pop()  # the refused message is not kept
                print(f"parley: {printable(error)}", file=sys.stderr)
                continue
            if end.text or end.reason != "cancelled":  # later turns read the reply, not the thought (as the app's)
                messages.append({"role": "assistant", "content": reply_text(end.text)})
            print(_status_line(end, cli.dropped.get(sid, 0)), file=sys.stderr)
    finally:
        cli.close()


def _stop(cli, sid: int, turn: int) -> None:
    """Ctrl-C mid-answer: the answer stops (a second Ctrl-C while it does ends the chat)."""
    cli.engine.cancel(sid)
    cli.run([turn])


# why an answer ended, where it did not end by itself: the user should know it was cut and why
ENDINGS = {"length": "cut at the max tokens", "context_full": "cut: the context is full", "cancelled": "stopped"}


def _status_line(end: ev.Finished, dropped: int) -> str:
    """[tokens, rate, context used; how it ended where it was cut; the oldest messages left out to fit]."""
    s = end.stats
    parts = [f"{s.completion_tokens} tokens" + (f", {s.tokens_per_s:.1f} tok/s" if s.tokens_per_s else ""),
             f"context {s.context_used}/{s.context_limit}"]
    if end.reason in ENDINGS:
        parts.append(ENDINGS[end.reason])
    if dropped:
        parts.append(f"{dropped} oldest message{'s' if dropped != 1 else ''} left out to fit")
    return f"[{', '.join(parts)}]"


def _line_editing() -> None:
    """At a terminal, lines are read through readline: arrow keys edit and recall them, and a line may pass the
    terminal's own limit of 4,095 characters (a longer paste was cut there without a word)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # input() reads through readline only then
        return
    try:
        import readline  # noqa: F401  (importing it is what puts input() on it)
    except ImportError:  # Windows: the console edits lines itself
        return


def _tty_settings(stream) -> tuple[int, list | None]:
    """`stream`'s descriptor and its terminal settings; None where it is no terminal (a pipe, Windows, a replaced
    stdin)."""
    try:
        import termios

        fd = stream.fileno()
        return fd, (termios.tcgetattr(fd) if os.isatty(fd) else None)
    except (ImportError, OSError, ValueError, AttributeError):
        return -1, None


@contextmanager
def settings_kept(stream) -> Iterator[None]:
    """The terminal's settings as they are now put back before SIGTERM, SIGHUP or SIGQUIT ends the process."""
    fd, saved = _tty_settings(stream)
    if saved is None:
        yield
        return
    import termios

    with _restored_before_signals(lambda: termios.tcsetattr(fd, termios.TCSANOW, saved)):
        yield


@contextmanager
def keys_held_back(stream) -> Iterator[None]:
    """While an answer streams, keys typed at a terminal are not echoed into it, and are dropped when it ends
    (rather than sent as the next prompt). Ctrl-C still stops the answer. Not a terminal: nothing changes."""
    fd, saved = _tty_settings(stream)
    if saved is None:
        yield
        return
    import termios

    quiet = list(saved)
    quiet[3] &= ~termios.ECHO
    # the handlers are set before echo goes off and kept until it is back on: a signal in between found it off
    with _restored_before_signals(lambda: termios.tcsetattr(fd, termios.TCSANOW, saved)):
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
        try:
            yield
        finally:
            termios.tcflush(fd, termios.TCIFLUSH)
            termios.tcsetattr(fd, termios.TCSANOW, saved)


@contextmanager
def _restored_before_signals(restore) -> Iterator[None]:
    """SIGTERM, SIGHUP or SIGQUIT mid-answer: `restore` runs, then the signal does what it did before (killed with
    echo off, the process left the user's shell showing no keys typed). These and Ctrl-C act at once whichever thread
    the kernel gave them to."""
    import signal

    signums = [getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n)]
    # None: a handler set outside Python, which cannot be put back: the default's ending instead
    previous = {signum: signal.getsignal(signum) or signal.SIG_DFL for signum in signums}

    def handler(signum, _frame) -> None:
        try:
            restore()
        except OSError:  # the terminal hung up: nothing left to restore
            pass
        signal.signal(signum, previous[signum])
        os.kill(os.getpid(), signum)

    handlers = {signum: handler for signum in signums}
    if callable(signal.getsignal(signal.SIGINT)):  # Ctrl-C as before (KeyboardInterrupt), as promptly
        handlers[signal.SIGINT] = signal.getsignal(signal.SIGINT)
    with handled_in_main_thread(handlers):
        yield


def typed(text: str) -> str:
    """A prompt from the command line or standard input as typed: bytes the locale could not decode (an ASCII locale
    Python did not switch to UTF-8, PYTHONIOENCODING=ascii) arrive as surrogate escapes and are read as UTF-8, not
    handed to the model as escapes."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte: kept as it came
        return text


def safe_output(text: str) -> str:
    """A model's text for the terminal: control characters other than newline and tab shown escaped (a model led
    to emit ESC ] 0 ; … would retitle the window, ESC [ 2 J clear it, \\r overwrite a line); the rest of Unicode
    (joiners of emoji, no-break spaces) passes as it is."""
    text = text.replace("\r\n", "\n")
    return "".join(ascii(ch)[1:-1] if unicodedata.category(ch) == "Cc" and ch not in "\n\t" else ch for ch in text)


def _write(_turn, text: str) -> None:
    sys.stdout.write(safe_output(text))
    sys.stdout.flush()


def printable(text: str) -> str:
    """Text from a model file (its name, a template's error) with control characters shown escaped: an escape
    sequence in it must not reach the terminal raw (it could move the cursor, retitle the window or hide text)."""
    return "".join(ch if ch.isprintable() or ch == "\n" else ascii(ch)[1:-1] for ch in str(text))
