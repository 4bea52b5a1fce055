"""A streamed call's open argument string, extended piece by piece without reading the call again (engine/tool_calls.py).

A call's reader reads its whole text at each piece: a 32k-character argument (a file's text) cost ~100 µs a piece,
quadratic in its length. While the text ends inside one of the arguments' strings, a piece that does not end the
string only lengthens it: the arguments' JSON so far, read here as it is sent, says where a string is open.
"""
from __future__ import annotations

import json
import re

from engine.tokenizer.detokenizer import partial_suffix

_QUOTE_OR_ESCAPE = re.compile(r'["\\]')


class JsonTail:
    """Whether a JSON text read so far ends inside a string (and after its escaping backslash)."""

    __slots__ = ("in_string", "escaped")

    def __init__(self) -> None:
        self.in_string = self.escaped = False

    def update(self, piece: str) -> None:
        self.in_string, self.escaped = self._after(piece)[:2]

    def stays_in_string(self, piece: str) -> bool:
        """Whether the text, `piece` added, is inside the same string all along."""
        return self.in_string and not self._after(piece)[2]

    def _after(self, piece: str) -> tuple[bool, bool, bool]:
        """(in a string, after a backslash, a string closed on the way) once `piece` is read."""
        in_string, i, closed = self.in_string, 0, False
        if self.escaped and piece:
            i = 1
        elif self.escaped:
            return True, True, False
        while i < len(piece):
            if not in_string:
                i = piece.find('"', i)
                if i < 0:
                    break
                in_string, i = True, i + 1
                continue
            found = _QUOTE_OR_ESCAPE.search(piece, i)
            if found is None:
                break
            if found.group() == '"':
                in_string, closed, i = False, True, found.end()
            elif found.end() == len(piece):
                return True, True, closed
            else:
                i = found.end() + 1
        return in_string, False, closed


class OpenString:
    """The open argument string a section's text ends in: the arguments' characters each later piece adds, as long as
    no piece may end it. `closers`: for arguments written as text values (Qwen's XML, GLM), the tags that end a value;
    none where the arguments are the model's own JSON."""

    def __init__(self, index: int, tail: JsonTail, closers: tuple[str, ...]) -> None:
        self.index, self._tail, self._closers = index, tail, closers
        self._held = ""  # a text value's end that may begin its closing tag: sent once it turns out not to

    def extend(self, piece: str) -> str | None:
        """The arguments' characters `piece` adds, or None where it may do more than lengthen the string."""
        if not self._closers:  # the model's JSON: the piece as written, while it stays in the string
            if not self._tail.stays_in_string(piece):
                return None
            added = piece
        else:
            held = self._held + piece
            if any(c in held for c in self._closers):
                return None
            keep = partial_suffix(held, self._closers) if _may_begin(held, self._closers) else 0
            self._held = held[len(held) - keep:]
            added = json.dumps(held[:len(held) - keep], ensure_ascii=False)[1:-1]  # escaped character by character
        self._tail.update(added)
        return added


def _may_begin(text: str, closers: tuple[str, ...]) -> bool:
    """Whether the end of `text` may begin a closer: it holds a closer's first character (partial_suffix costs ~5 µs)."""
    tail = text[-max(map(len, closers)):]
    return any(c[0] in tail for c in closers)
