"""A growing code block highlighted a run of lines at a time, as the block highlighted whole would colour each run.

Lexed alone, a run started in the lexer's first state: a docstring or a comment begun in an earlier run was coloured as
code until the answer ended and the block was highlighted whole. Runs are lexed in segments instead: a segment ends
after a run where nothing the lexer read or tried runs on past it, and the next segment starts in the state the lexer
was in there (Pygments' RegexLexer takes a start stack), so each run lexes as it does in the whole block. A lexer that
cannot start mid-way (an ExtendedRegexLexer, whose context holds YAML's indentation and whose callbacks read on past
its rules, Ruby's here-document; a method of its own without a stack, Common Lisp's) is cut only where it is as at its
start. A construct open at a run's end is lexed whole with the runs it spans: a token running on past the run
(Python's docstring rule matches the string from its opening quotes to its closing ones at once), or a rule tried in
the run that reads on to its end, failed or matched short (a shell here-document, one rule's match from `<<EOF` to the
line `EOF`; JavaScript's /* */ comment: the `regex` module's partial match of the rule made never to match tells). The
lexer's state is read where it first tries a rule at the run's end: the text is lexed with a character after it that
no code holds (markdown-it turns NUL into U+FFFD) and its rules wrapped. A segment ends after MAX_SEGMENT_RUNS runs
whatever it holds, and then its runs may not read as the whole block's (nor may those of a lexer with a method of its
own, or without that loop, JSON's, each run lexed alone): `exact` says so, and the finished block is lexed whole then
(app/core/markdown_render.py).
"""
from __future__ import annotations

import functools
import inspect
import logging
import re
import sys
from dataclasses import dataclass
from io import StringIO

import regex

from pygments.formatter import Formatter
from pygments.lexer import ExtendedRegexLexer, Lexer, RegexLexer
from pygments.token import Error, _TokenType

log = logging.getLogger(__name__)
SENTINEL = "\x00"  # after a segment's text: where the lexer reaches it, its state is the segment's end state
GLOBAL_FLAGS = re.compile(r"(?:\(\?[aiLmsux]+\))+")
START = ("root",)  # a RegexLexer's first state
# a segment ends after this many runs whatever it holds: a construct that never closes (or a rule that always reads on
# to the end) would otherwise keep it open, and every token of the block would lex all of it again
MAX_SEGMENT_RUNS = 8

Token = tuple[_TokenType, str]
Line = tuple[Token, ...]  # one line's tokens, those of a type run together merged


@dataclass(frozen=True, slots=True)
class Run:
    html: str
    lines: tuple[Line, ...]  # what the html shows, to tell whether a whole block's highlighting of the run is the same


@dataclass(frozen=True, slots=True)
class LexState:
    """Where a lexer is between two runs: what the segment after them starts from. Compared by `key` alone."""

    key: tuple = ()  # () is the lexer's own first state
    stack: tuple[str, ...] = START


FIRST = LexState()


@dataclass(frozen=True, slots=True)
class Segment:
    runs: list[Run]
    after: LexState | None  # where the next run starts; None: the segment goes on with it
    exact: bool = True  # False: cut where the whole block's lexing may read otherwise (or a lexer without states)


def highlight_segment(texts: tuple[str, ...], lexer: Lexer, formatter: Formatter, start: LexState = FIRST,
                      settle: bool = True) -> Segment:
    """Runs of whole lines (each ending in a newline) lexed together from `start`, each formatted, and where the runs
    after them start. Without `settle` (a segment that ends in the block's growing last run, which nothing follows
    yet) only the runs."""
    try:
        tokens, after, exact = _lex("".join(texts), lexer, start, settle)
        if settle and after is None and len(texts) >= MAX_SEGMENT_RUNS:
            after, exact = (_end_state("".join(texts), lexer, start) or FIRST), False
    except Exception:  # noqa: BLE001 - the watch reads Pygments' internals: another version's may differ
        log.warning("streaming highlight fell back to lexing each run alone (%s)", type(lexer).__name__, exc_info=True)
        tokens, after, exact = _plain("".join(texts), lexer, FIRST), FIRST, False  # the finished block is lexed whole
    lines, runs, at = split_lines(tokens), [], 0
    for text in texts:
        mine, at = lines[at:at + text.count("\n")], at + text.count("\n")
        runs.append(Run(format_tokens([token for line in mine for token in line], formatter), mine))
    return Segment(runs, after, exact)


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


def _lex(text: str, lexer: Lexer, start: LexState, settle: bool) -> tuple[list[Token], LexState | None, bool]:
    """`text`'s tokens from `start`; with `settle`, where the text after it starts (None where something the lexer read
    or tried runs on past the text) and whether that is where the whole block's lexing would be."""
    if not isinstance(lexer, RegexLexer):  # no state to read (JSON's): each run alone, as before, unless it lexed wrong
        tokens = _plain(text, lexer, start)
        return tokens, FIRST if settle and not any(kind in Error for kind, _ in tokens) else None, False
    if not settle:
        return _plain(text, lexer, start), None, True
    watch = _Watch(lexer)
    extended, own, resumes = isinstance(lexer, ExtendedRegexLexer), _overridden(type(lexer)), _resumes(lexer)
    first = None if resumes else watch.lex("", FIRST)[1]
    tokens, end = watch.lex(text, start)
    if end is None or own and not extended:
        tokens = _plain(text, lexer, start)  # a token ran on into the sentinel; or a lexer that names types apart (C's)
    if end is None or watch.reaches:
        return tokens, None, True
    if not resumes:  # callbacks that read on past its rules (Ruby's here-document), a method of its own that cannot
        return tokens, FIRST if end == first else None, False  # start mid-way (Common Lisp's): cut where it starts
    # the finished block is lexed whole where a method of its own may keep more state, or where a rule tried in the
    # trailing blank space read on past it (the next run's first token may start there in the whole block: FoxPro's)
    return tokens, end, not own and not watch.blank_reaches


def _end_state(text: str, lexer: Lexer, start: LexState) -> LexState | None:
    """Where the lexer is at the end of `text` lexed from `start`, whatever ran on past it (None where a token did or
    where the next text cannot start there)."""
    return _Watch(lexer, probe=False).lex(text, start)[1] if _resumes(lexer) else None


def _resumes(lexer: Lexer) -> bool:
    """Whether a lexing can start in the state another ended in: a RegexLexer whose own method (if any) takes a stack."""
    if not isinstance(lexer, RegexLexer) or isinstance(lexer, ExtendedRegexLexer):
        return False
    return not _overridden(type(lexer)) or "stack" in inspect.signature(type(lexer).get_tokens_unprocessed).parameters


def _plain(text: str, lexer: Lexer, start: LexState) -> list[Token]:
    """`text`'s tokens from `start`, by the lexer's own method where it can start there."""
    if start == FIRST or not isinstance(lexer, RegexLexer):
        stream = lexer.get_tokens_unprocessed(text)
    else:  # one that resumes (_lex cuts the others only where they start)
        stream = lexer.get_tokens_unprocessed(text, start.stack)
    return [(kind, value) for _, kind, value in stream]


def _overridden(cls: type) -> bool:
    return cls.get_tokens_unprocessed is not RegexLexer.get_tokens_unprocessed


class _Watch:
    """Lexes through the loop of RegexLexer (or ExtendedRegexLexer) with its rules wrapped, to read its state where it
    reaches the text's end and to tell whether a rule tried before that could read on past it (the `regex` module's
    partial match): a shell here-document (`cat <<EOF` ... `EOF`, one rule's match across lines) lexed as plain code
    until its end marker came, then as a string from its start. A rule tried in the blank space that ends the text is
    let be: the next text starts with what it leaves there (as before this watch: Python's soft keywords and C's
    `#if 0` read on past every line's end), but noted (`blank_reaches`): the cut may not be where the whole block's is."""

    def __init__(self, lexer: RegexLexer, probe: bool = True):
        self.lexer, self.text, self.full, self.reaches, self.at_end, self.probe = lexer, "", "", False, None, probe
        self.own = vars(lexer).get("_tokens")  # rules of its own (C#'s, for its Unicode level), else its class's
        self.rules = {state: [(self._rule(match), action, new) for match, action, new in rules]
                      for state, rules in lexer._tokens.items()}

    def lex(self, text: str, start: LexState) -> tuple[list[Token], LexState | None]:
        """`text`'s tokens from `start`, and the lexer's state where it first tries a rule at the text's end (None
        where a token runs on past the end)."""
        self.text, self.at_end, self.reaches, self.blank_reaches = text, None, False, False
        self.tail = len(text.rstrip())  # where its trailing blank lines begin
        self.lexer._tokens = self.rules  # the instance's, for this lexing: the class's stay as they are
        full = self.full = text + SENTINEL
        if isinstance(self.lexer, ExtendedRegexLexer):  # its context made as its own method makes it (YAML's)
            stream = self.lexer.get_tokens_unprocessed(full)
        else:
            stream = RegexLexer.get_tokens_unprocessed(self.lexer, full, start.stack)
        tokens = []
        try:
            for pos, kind, value in stream:
                if pos >= len(text) or self.at_end is not None:
                    break
                if pos + len(value) > len(text):
                    return tokens, None
                tokens.append((kind, value))
        finally:
            stream.close()
            if self.own is None:
                del self.lexer._tokens
            else:
                self.lexer._tokens = self.own
        return tokens, self.at_end

    def _rule(self, match):
        partial = _partial_pattern(match.__self__.pattern, match.__self__.flags) if self.probe else None

        def watched(text, pos, *endpos):
            if text is not self.full:  # a part the lexer lexes again with itself (`using(this)`: C's macros)
                pass
            elif pos == len(self.text) and self.at_end is None:
                self.at_end = _state(sys._getframe(1).f_locals)
            elif pos < self.tail and partial is not None and not self.reaches:
                self.reaches = partial.match(self.text, pos, partial=True) is not None
            elif pos < len(self.text) and partial is not None and not self.blank_reaches:  # its trailing blank space
                self.blank_reaches = partial.match(self.text, pos, partial=True) is not None
            return match(text, pos, *endpos)
        return watched


def _state(lexing: dict) -> LexState:
    """The state a RegexLexer's loop (its locals) is in: its stack, and an ExtendedRegexLexer's context's fields."""
    if "ctx" not in lexing:
        return LexState(tuple(lexing["statestack"]), tuple(lexing["statestack"]))
    context = lexing["ctx"]
    fields = tuple((name, repr(value)) for name, value in sorted(vars(context).items())
                   if name not in ("text", "pos", "end"))
    return LexState(fields, tuple(context.stack))


@functools.lru_cache(maxsize=4096)
def _partial_pattern(pattern: str, flags: int) -> regex.Pattern | None:
    """A rule's pattern that fails where it would match, compiled by `regex`: it matches partly where the rule, tried at
    a place, reads on to the text's end (past the sentinel) before it matches or fails, as the rule would read more
    text: whether it failed there or matched what it tried after (Pygments' here-document rule backtracks to `<<E`
    ... `$HOME`'s E until the line EOF comes). (*PRUNE) stops it at its first match: a docstring closed in the text
    has no longer match tried. None if `regex` cannot compile it."""
    flag = GLOBAL_FLAGS.match(pattern)  # kept in front: Python's and regex's global flags go first
    head, body = (flag.group(), pattern[flag.end():]) if flag else ("", pattern)
    try:
        return regex.compile(f"{head}(?:{body})(*PRUNE)(*F)", flags)
    except (regex.error, ValueError, TypeError):
        return None
