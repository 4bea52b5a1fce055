"""A growing code block highlighted a run of lines at a time, as the block highlighted whole would colour each run.

Lexed alone, a run started in the lexer's first state: a docstring or a comment begun in an earlier run was coloured as
code until the answer ended and the block was highlighted whole. Runs are now lexed in segments: a segment starts
where the lexer is in its first state ('root') and takes the runs after it together until the lexer is back there, so
a construct open at a run's end is lexed whole with the runs it spans (Python's docstring rule matches the string from
its opening quotes to its closing ones at once). A run with an error token stays open too: an unclosed construct that
one regular expression matches once closed (JavaScript's /* */ comment) lexes as errors until then, and so does one
where a rule tried in it reads on to its end (a shell here-document, one rule's match from `<<EOF` to the line `EOF`:
the `regex` module's partial match tells). Pygments' RegexLexer keeps the state it ends in to itself: the text is lexed
with a character after it that no code holds (markdown-it turns NUL into U+FFFD) and its rules wrapped, and the state
is read off the lexer's loop where it reaches the text's end (an ExtendedRegexLexer's context too: YAML's indentation
of a block scalar). A lexer without that loop (JSON's) has each run lexed alone, as before; a finished block is checked
against a whole lexing either way (app/core/markdown_render.py).
"""
from __future__ import annotations

import functools
import operator
import re
import sys
from dataclasses import dataclass
from io import StringIO

import regex

from pygments.formatter import Formatter
from pygments.lexer import ExtendedRegexLexer, Lexer, RegexLexer
from pygments.token import Error, _TokenType

SENTINEL = "\x00"  # after a segment's text: where the lexer reaches it, its state is the segment's end state
GLOBAL_FLAGS = re.compile(r"(?:\(\?[aiLmsux]+\))+")
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


def highlight_segment(texts: tuple[str, ...], lexer: Lexer, formatter: Formatter,
                      settle: bool = True) -> tuple[list[Run], bool]:
    """Runs of whole lines (each ending in a newline) lexed together from the lexer's first state, each formatted;
    and whether the lexer is back in its first state after them (the next run can start a segment of its own). Not
    read without `settle`: a segment that ends in the block's growing last run, which nothing follows yet."""
    tokens, closed = _lex("".join(texts), lexer, settle)
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


def _lex(text: str, lexer: Lexer, settle: bool) -> tuple[list[Token], bool]:
    """`text`'s tokens, and (with `settle`) whether the text after it lexes alone as it would after it: the lexer ends
    in its first state and no rule that failed in the text could match given more of it (True where the state cannot be
    read: as before). Without `settle` (a growing last run, nothing after it yet) only the tokens."""
    plain = lambda: [(kind, value) for _, kind, value in lexer.get_tokens_unprocessed(text)]  # noqa: E731
    if not settle or not isinstance(lexer, RegexLexer):
        return plain(), not isinstance(lexer, RegexLexer)
    watch = _Watch(lexer)
    first = watch.lex("")[1]
    tokens, end = watch.lex(text)
    own = type(lexer).get_tokens_unprocessed
    if end is None or not isinstance(lexer, ExtendedRegexLexer) and own is not RegexLexer.get_tokens_unprocessed:
        tokens = plain()  # a token ran on into the sentinel; or C's lexer, which names its types apart
    return tokens, end is not None and any(map(operator.eq, end, first)) and not watch.reaches


class _Watch:
    """Lexes through the loop of RegexLexer (or ExtendedRegexLexer, whose lexers keep more state in a context of their
    own: YAML's indentation) with its rules wrapped, to read its state at the text's end and to tell whether a rule that
    failed before it could match with more text (the `regex` module's partial match): a shell here-document (`cat
    <<EOF` ... `EOF`, one rule's match across lines) lexed as plain code until its end marker came, then as a string."""

    def __init__(self, lexer: RegexLexer):
        self.lexer, self.text, self.reaches, self.at_end = lexer, "", False, None
        self.rules = {state: [(self._rule(match), action, new) for match, action, new in rules]
                      for state, rules in type(lexer)._tokens.items()}

    def lex(self, text: str) -> tuple[list[Token], tuple | None]:
        """`text`'s tokens and the lexer's state where it reaches the text's end: where it first tries a rule there, and
        where it has read the sentinel (after the moves that take no text: JavaScript's back to 'root'); None where a
        token runs on past the end."""
        self.text, self.at_end = text, None
        self.lexer._tokens = self.rules  # the instance's own: the class's stay as they are
        extended = isinstance(self.lexer, ExtendedRegexLexer)
        stream = (self.lexer.get_tokens_unprocessed(text + SENTINEL) if extended
                  else RegexLexer.get_tokens_unprocessed(self.lexer, text + SENTINEL, START))
        tokens, end = [], None
        try:
            for pos, kind, value in stream:
                if pos >= len(text):
                    end = (self.at_end, _state(stream.gi_frame.f_locals))
                    break
                if pos + len(value) > len(text):
                    break
                tokens.append((kind, value))
        finally:
            stream.close()
            del self.lexer._tokens
        return tokens, end

    def _rule(self, match):
        partial = _partial_pattern(match.__self__.pattern, match.__self__.flags)

        def watched(text, pos, *endpos):
            if pos == len(self.text) and self.at_end is None:
                self.at_end = _state(sys._getframe(1).f_locals)
            if pos < len(self.text) and partial is not None and not self.reaches:
                self.reaches = partial.match(text, pos, partial=True) is not None
            return match(text, pos, *endpos)
        return watched


def _state(lexing: dict) -> tuple:
    """The state a RegexLexer's loop (its locals) is in: its stack, and an ExtendedRegexLexer's context's other fields."""
    if "ctx" not in lexing:
        return tuple(lexing["statestack"])
    fields = vars(lexing["ctx"])
    return tuple((name, repr(value)) for name, value in sorted(fields.items()) if name not in ("text", "pos", "end"))


@functools.lru_cache(maxsize=4096)
def _partial_pattern(pattern: str, flags: int) -> regex.Pattern | None:
    """A rule's pattern made never to match, compiled by `regex`: it matches partly wherever the rule, tried at a place,
    reads on to the text's end (past the sentinel), whether it failed there or matched less than it could with more text
    (Pygments' here-document rule backtracks to `<<E` ... `$HOME`'s E until the line EOF comes). None if it cannot."""
    flag = GLOBAL_FLAGS.match(pattern)  # kept in front: Python's and regex's global flags go first
    head, body = (flag.group(), pattern[flag.end():]) if flag else ("", pattern)
    try:
        return regex.compile(f"{head}(?:{body})(?!)", flags)
    except (regex.error, ValueError, TypeError):
        return None
