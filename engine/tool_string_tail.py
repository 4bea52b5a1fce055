"""A streamed call's open arguments, extended piece by piece without reading the call again (engine/tool_calls.py).

A call's reader reads its whole text at each piece: a 32k-character argument (a file's text) cost ~100 µs a piece,
quadratic in its length. While the text ends inside one of the arguments' strings, a piece that does not end the
string only lengthens it: the arguments' JSON so far, read here as it is sent, says where a string is open. Where the
arguments are the model's own JSON, a piece that does not close their object only lengthens them too (a call of 1,000
short arguments closed a string every few pieces, each read the whole call again: 3 s). Inside an argument's value
that is not text (Qwen XML's, GLM's), of which nothing goes out before its closing tag, a piece that holds no closing
tag adds nothing (an array written over 10k pieces was read whole at each: ~53 µs a piece, quadratic).
"""
from __future__ import annotations

import re
from functools import lru_cache
from json.encoder import encode_basestring  # json.dumps(text, ensure_ascii=False)'s own, without its Python layers

_QUOTE_OR_ESCAPE = re.compile(r'["\\]')
_STRUCTURE = re.compile(r'["{}\[\]]')  # outside a string: what opens one or nests a value (as tool_formats' value_end)


class JsonTail:
    """Whether a JSON text read so far ends inside a string (and after its escaping backslash), and how deep in its
    objects and arrays."""

    __slots__ = ("in_string", "escaped", "depth")

    def __init__(self) -> None:
        self.in_string = self.escaped = False
        self.depth = 0

    def update(self, piece: str) -> None:
        self.in_string, self.escaped, self.depth, _ = self._after(piece)

    def stays_open(self, piece: str) -> bool:
        """Whether the text's outermost value, `piece` added, is open all along (its closing bracket not read)."""
        return self.depth > 0 and not self._after(piece)[3]

    def _after(self, piece: str) -> tuple[bool, bool, int, bool]:
        """(in a string, after a backslash, the depth, the outermost value closed on the way) once `piece` is read."""
        in_string, depth, i, ended = self.in_string, self.depth, 0, False
        if self.escaped and piece:
            i = 1
        elif self.escaped:
            return True, True, depth, False
        while i < len(piece):
            found = (_QUOTE_OR_ESCAPE if in_string else _STRUCTURE).search(piece, i)
            if found is None:
                break
            mark, i = found.group(), found.end()
            if mark == "\\" and i == len(piece):
                return True, True, depth, ended
            if mark == "\\":
                i += 1
            elif mark == '"':
                in_string = not in_string
            else:
                depth += 1 if mark in "{[" else -1
                ended = ended or depth <= 0
        return in_string, False, depth, ended


class OpenString:
    """The open argument string a section's text ends in: the arguments' characters each later piece adds, as long as
    no piece may end it. `closers`: for arguments written as text values (Qwen's XML, GLM), the tags that end a value;
    none where the arguments are the model's own JSON."""

    def __init__(self, index: int, tail: JsonTail, closers: tuple[str, ...], quiet: bool = False) -> None:
        self.index, self._tail, self._closers = index, tail, closers
        self._quiet = quiet  # a value that is not text: nothing goes out before its closing tag (read whole then)
        self._held = ""  # a text value's end that may begin its closing tag: sent once it turns out not to

    def extend(self, piece: str) -> str | None:
        """The arguments' characters `piece` adds, or None where it may do more than lengthen the string (the model's
        JSON: more than lengthen the arguments; a value that is not text: more than lengthen it, which adds none)."""
        if not self._closers:  # the model's JSON: the piece as written, while the arguments' object stays open
            if not self._tail.stays_open(piece):
                return None
            added = piece
        else:
            held = self._held + piece
            if any(c in held for c in self._closers):
                return None
            begun = _closer_starts(self._closers).search(held, max(0, len(held) - _longest(self._closers)))
            keep = len(held) - begun.start() if begun else 0
            self._held = held[len(held) - keep:]
            if self._quiet:
                return ""
            # escaped character by character: the string stays open, unescaped, so the tail's state stays as it is
            return encode_basestring(held[:len(held) - keep])[1:-1]
        self._tail.update(added)
        return added


@lru_cache(maxsize=8)
def _closer_starts(closers: tuple[str, ...]) -> re.Pattern:
    """What may begin one of `closers` at a text's end, found leftmost (the longest): one search, where partial_suffix's
    loop over the lengths cost ~4 µs a piece."""
    prefixes = sorted({c[:n] for c in closers for n in range(1, len(c))}, key=len, reverse=True)
    return re.compile("(?:" + "|".join(map(re.escape, prefixes)) + r")\Z")


@lru_cache(maxsize=8)
def _longest(closers: tuple[str, ...]) -> int:
    return max(map(len, closers))
