"""Where `parley generate` takes its prompts from: --prompt TEXT, --prompt-file PATH ('-': stdin), or a piped stdin;
and `parley chat` its lines."""
from __future__ import annotations

import argparse
import codecs
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ParleyError

STDIN = "-"
# the most bytes a token stands for in a prompt file, generously: 128 characters (Gemma 3's longest is 31, 48 bytes)
# of 4 bytes each (UTF-32, or UTF-8's widest); a file longer than its context's tokens at this rate cannot fit
BYTES_PER_TOKEN = 512
# a file that opens with a byte-order mark says its encoding: Notepad's UTF-8 writes one, PowerShell 5's `>` UTF-16;
# UTF-32's marks first, as UTF-16 LE's is the start of UTF-32 LE's
MARKED = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
          (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


@dataclass(frozen=True, slots=True)
class PromptFile:
    """A --prompt-file argument, kept in the prompts' order until the files are read."""
    path: str


def add_prompt_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", dest="prompts", action="append", default=[], help="may be given several times")
    p.add_argument("--prompt-file", dest="prompts", action="append", type=_prompt_file, metavar="PATH",
                   help="a file whose whole text is one prompt; '-' reads stdin; may be given several times. "
                        "With neither option, a prompt piped on stdin is read")


def _prompt_file(text: str) -> PromptFile:
    """A blank path read as the working folder: 'Could not read the prompt file : Is a directory.'"""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"a file's path, or '-' for stdin, not {text!r}")
    return PromptFile(text)


@dataclass(frozen=True, slots=True)
class PromptBound:
    """How much of a file or stdin is read: a prompt of `tokens` (--context) tokens is at most `most` bytes, so
    /dev/zero, `yes |` or a 50 MB file is refused once that much is read, before the model loads."""
    tokens: int

    @property
    def most(self) -> int:
        return self.tokens * BYTES_PER_TOKEN

    def refusal(self, what: str, unit: str) -> ParleyError:
        return ParleyError(f"{what} is over {self.most:,} {unit}, more than a prompt of {self.tokens:,} tokens can be "
                           f"({BYTES_PER_TOKEN} {unit} a token at most): shorten it, or raise --context "
                           f"({self.tokens:,} now).")


def read_prompts(args: argparse.Namespace, bound: PromptBound) -> list[str]:
    """Each prompt's text, in the order given; a piped stdin when none was given."""
    given = list(args.prompts)
    if not given:
        if sys.stdin is None or sys.stdin.isatty():
            raise ParleyError("No prompt: give --prompt TEXT, --prompt-file PATH, or pipe one on stdin.")
        piped = _read(PromptFile(STDIN), bound)
        if not piped.strip():  # `< /dev/null` or an empty pipe: a mistake, not a prompt
            raise ParleyError("No prompt: stdin was empty; give --prompt TEXT or pipe one on stdin.")
        return [piped]
    if sum(isinstance(g, PromptFile) and g.path == STDIN for g in given) > 1:
        raise ParleyError("stdin can be read once: give --prompt-file - only once.")
    return [_read_some(g, bound) if isinstance(g, PromptFile) else g for g in given]


def read_line(bound: PromptBound) -> str:
    """A chat's next line without its line break (EOFError past the last): typed at a terminal through input() (and
    its line editing), or piped, read no further than a message of the bound's tokens could be (a 400 MB line took
    1.5 GB, /dev/zero all there was)."""
    if sys.stdin.isatty():
        return input("> ")  # piped lines get no prompt: stdout holds the answers alone, one per turn
    sys.stdout.flush()  # as input() does: each answer reaches a reader before the next line is read
    line = sys.stdin.readline(bound.most + 1)
    if not line:
        raise EOFError
    if len(line) > bound.most and not line.endswith("\n"):  # no line's end within the bound: the rest cannot fit
        raise bound.refusal("A line on stdin", "characters")
    return line.removesuffix("\n")


def _read_some(source: PromptFile, bound: PromptBound) -> str:
    """A prompt file's text; an empty one (/dev/null, a file not saved yet) is a mistake, as an empty pipe is."""
    text = _read(source, bound)
    if not text.strip():
        raise ParleyError(f"The prompt file {_name(source)} is empty.")
    return text


def _read(source: PromptFile, bound: PromptBound) -> str:
    """The file's text without its final line break (as `echo` and editors end a file): the prompt's own ends."""
    what = "The prompt on stdin" if source.path == STDIN else f"The prompt file {source.path}"
    try:
        if source.path == STDIN:  # text: counted in characters, never more than bytes
            text = _strict(_bounded(sys.stdin, bound, what, "characters")).removeprefix("\ufeff")
        else:
            with Path(source.path).open("rb") as file:
                text = _decoded(_bounded(file, bound, what, "bytes"))
    except FileNotFoundError:
        raise ParleyError(f"No such prompt file: {source.path}") from None
    except UnicodeDecodeError as exc:
        raise ParleyError(f"{what} is not {exc.encoding.upper().removesuffix('-SIG')} text (byte {exc.start:,}): save "
                          "it as UTF-8.") from None
    except OSError as exc:
        raise ParleyError(f"Could not read the prompt file {_name(source)}: {exc.strerror or exc}.") from None
    return text.removesuffix("\n").removesuffix("\r")


def _bounded(stream, bound: PromptBound, what: str, unit: str):
    """The stream's whole content, read no further than one unit past the bound."""
    data = stream.read(bound.most + 1)
    if len(data) > bound.most:
        raise bound.refusal(what, unit)
    return data


def _strict(text: str) -> str:
    """Stdin's text, where bytes it could not decode (kept as surrogate escapes: cli/main.py) are refused as a file's
    are, not replaced with U+FFFD (cli.terminal.typed) behind the user's back; valid UTF-8 an ASCII locale escaped
    reads as it is."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte: typed() keeps it as it came
        return text


def _decoded(data: bytes) -> str:
    """The text of a file in UTF-8, or in the encoding its byte-order mark names (the mark itself is no text: it went
    to the model as U+FEFF, which the answer echoed)."""
    encoding = next((name for mark, name in MARKED if data.startswith(mark)), "utf-8")
    return data.decode(encoding)


def _name(source: PromptFile) -> str:
    return "(stdin)" if source.path == STDIN else source.path
