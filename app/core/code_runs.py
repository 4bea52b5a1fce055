"""A growing code block highlighted a run of lines at a time, as the block highlighted whole would colour each run.

Lexed alone, a run started in the lexer's first state: a docstring or a comment begun in an earlier run was coloured as
code until the answer ended and the block was highlighted whole. Runs are now lexed in segments: a segment starts
where the lexer is in its first state ('root') and takes the runs after it together until the lexer is back there, so
a construct open at a run's end is lexed whole with the runs it spans (Python's docstring rule matches the string from
its opening quotes to its closing ones at once). A run with an error token stays open too: an unclosed construct that
one regular expression matches once closed (JavaScript's /* */ comment) lexes as errors until then. Pygments'
RegexLexer keeps the state it ends in to itself: the text is lexed with a character after it that no code holds
(markdown-it turns NUL into U+FFFD), and the stack is read off the lexer's frame when it reaches that character (C's
lexer, which renames some of RegexLexer's tokens, is read through RegexLexer's loop). A lexer without that loop (JSON's,
YAML's) has each run lexed alone, as before; a finished block is checked against a whole lexing either way
(app/core/markdown_render.py). A construct that one rule matches across lines without an error before it closes (a
shell here-document) is still coloured apart until the answer ends.
"""
from __future__ import annotations

from dataclasses import dataclass
from io import StringIO

from pygments.formatter import Formatter
from pygments.lexer import ExtendedRegexLexer, Lexer, RegexLexer
from pygments.token import Error, _TokenType

SENTINEL = "\x00"  # after a segment's text: where the lexer reaches it, its state is the segment's end state
START = ("root",)  # a RegexLexer's first state
# a segment ends after this many runs whatever its state: a stray character (an error token) would otherwise keep it
# open, and every token of the block would lex all of it again
MAX_SEGMENT_RUNS = 8

Token = tuple[_TokenType, str]
Line = tuple[Token, ...]  # one line's tokens, those of a type run together merged


@dataclass(frozen=True, slots=True)
class Run:
    html: str
    lines: tuple[Line, ...]  # what the html shows, to tell whether a whole block's highlighting of the run is the same


def highlight_segment(texts: tuple[str, ...], lexer: Lexer, formatter: Formatter) -> tuple[list[Run], bool]:
    """Runs of whole lines (each ending in a newline) lexed together from the lexer's first state, each formatted;
    and whether the lexer is back in its first state after them (the next run can start a segment of its own)."""
    tokens, closed = _lex("".join(texts), lexer)
    closed = len(texts) >= MAX_SEGMENT_RUNS or (closed and not any(kind in Error for kind, _ in tokens))
    lines, runs, at = split_lines(tokens), [], 0
    for text in texts:
        mine, at = lines[at:at + text.count("\n")], at + text.count("\n")
        runs.append(Run(format_tokens([token for line in mine for token in line], formatter), mine))
    return runs, closed


def format_tokens(tokens: list[Token], formatter: Formatter) -> str:
    out = StringIO()
    formatter.format(tokens, out)
    return out.getvalue()


def split_lines(tokens) -> tuple[Line, ...]:
    """Tokens cut after each newline, a line's tokens of one type merged: two lexings that a formatter draws the same
    compare equal however they split their tokens (the formatter merges them too)."""
    lines, line = [], []
    for kind, value in tokens:
        for piece in value.replace("\n", "\n\x00").split("\x00"):  # after newlines only (str.splitlines cuts at \f too)
            if not piece:
                continue
            if line and line[-1][0] == kind:
                line[-1] = (kind, line[-1][1] + piece)
            else:
                line.append((kind, piece))
            if piece.endswith("\n"):
                lines.append(tuple(line))
                line = []
    if line:
        lines.append(tuple(line))
    return tuple(lines)


def _lex(text: str, lexer: Lexer) -> tuple[list[Token], bool]:
    """`text`'s tokens, and whether the lexer ends in its first state (True where that cannot be read: as before)."""
    if not isinstance(lexer, RegexLexer) or isinstance(lexer, ExtendedRegexLexer):  # a state of their own (JSON's)
        return [(kind, value) for _, kind, value in lexer.get_tokens_unprocessed(text)], True
    tokens, end = [], None
    stream = RegexLexer.get_tokens_unprocessed(lexer, text + SENTINEL, START)  # the loop whose state stack we read
    for pos, kind, value in stream:
        if pos >= len(text):  # the sentinel: every token of the text is out, its last state change made
            end = tuple(stream.gi_frame.f_locals["statestack"])
            break
        if pos + len(value) > len(text):  # a token running on into the sentinel: the text alone lexes otherwise
            break
        tokens.append((kind, value))
    stream.close()
    if end is None or type(lexer).get_tokens_unprocessed is not RegexLexer.get_tokens_unprocessed:
        tokens = [(kind, value) for _, kind, value in lexer.get_tokens_unprocessed(text)]  # C's names its types apart
    return tokens, end == START
