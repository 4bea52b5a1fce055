"""A JSON text read a value at a time where a plan says so, from pieces of text, each leaf by json's own decoder.

json.loads of a whole 25 MB chat export is one C call that held the GIL 160 ms, and with it the GUI thread (joining the
decoded text into one string another 33 ms). Read from 1 MiB pieces a message at a time, the reading thread lets the GIL
go between values, and no C call sees more than a value and a piece. Same values and errors as json.loads."""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable

SPACE = re.compile(r"[ \t\n\r]*")
NUMBER_REST = re.compile(r"[0-9.eE+\-]*")  # what may still follow a number's digits: its fraction and exponent
# where to go a piece at a time: an object's keys to their own plans, a list's plan for every element; None: one call
Plan = dict[str, "Plan"] | list | None


class JsonPieces:
    def __init__(self, pieces: Iterable[str], parse_constant: Callable[[str], Any] | None = None):
        self._pieces = iter(pieces)
        self._more = True
        self.text, self.pos = "", 0  # the text not read yet begins at self.pos
        self._base = 0  # where self.text begins in the whole text
        self._lines, self._line_start = 0, 0  # newlines in the text let go, and where the line after the last begins
        self._decode = json.JSONDecoder(parse_constant=parse_constant).raw_decode

    def document(self, plan: Plan) -> Any:
        """The whole text's one value; json.JSONDecodeError as json.loads raises it."""
        value = self.value(plan)
        if self._peek():
            raise self._error("Extra data", self.pos)
        return value

    def value(self, plan: Plan = None) -> Any:
        first = self._peek()
        if isinstance(plan, dict) and first == "{":
            return self._object(plan)
        if isinstance(plan, list) and first == "[":
            return self._array(plan[0] if plan else None)
        while True:
            try:
                value, end = self._decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                if not self._fill():  # a value cut at the piece's end reads whole with the next piece
                    raise self._error(exc.msg, exc.pos) from None
                continue
            if not _cut_number(value, self.text, end) or not self._fill():
                self.pos = end
                return value

    def _object(self, plan: dict[str, Plan]) -> dict:
        self.pos += 1
        out: dict = {}
        if self._peek() == "}":
            self.pos += 1
            return out
        while True:
            if self._peek() != '"':
                raise self._error("Expecting property name enclosed in double quotes", self.pos)
            key = self.value()
            self._expect(":")
            out[key] = self.value(plan.get(key))  # a key twice: the last one, as json.loads
            if self._after("}"):
                return out

    def _array(self, plan: Plan) -> list:
        self.pos += 1
        out: list = []
        if self._peek() == "]":
            self.pos += 1
            return out
        while True:
            out.append(self.value(plan))
            if self._after("]"):
                return out

    def _after(self, end: str) -> bool:
        """True at the container's end; past the ',' before its next value otherwise."""
        char = self._peek()
        if char not in (end, ","):
            raise self._error("Expecting ',' delimiter", self.pos)
        self.pos += 1
        return char == end

    def _expect(self, char: str) -> None:
        if self._peek() != char:
            raise self._error(f"Expecting '{char}' delimiter", self.pos)
        self.pos += 1

    def _peek(self) -> str:
        """The next character that is not white space ('' at the end), not read."""
        while True:
            self.pos = SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text) or not self._fill():
                return self.text[self.pos:self.pos + 1]

    def _fill(self) -> bool:
        """The next piece after the text not read yet (what was read is let go); False at the end."""
        piece = next(self._pieces, None) if self._more else None
        if piece is None:
            self._more = False
            return False
        done = self.text[:self.pos]
        if "\n" in done:
            self._lines += done.count("\n")
            self._line_start = self._base + done.rindex("\n") + 1
        self._base += self.pos
        self.text, self.pos = self.text[self.pos:] + piece, 0
        return True

    def _error(self, msg: str, pos: int) -> json.JSONDecodeError:
        """json.loads' error at `pos` of self.text, with its line, column and place in the whole text."""
        newline = self.text.rfind("\n", 0, pos)
        line = self._lines + self.text.count("\n", 0, pos) + 1
        column = pos - newline if newline >= 0 else self._base + pos - self._line_start + 1
        where = self._base + pos
        error = json.JSONDecodeError(msg, self.text, pos)
        error.args = (f"{msg}: line {line} column {column} (char {where})",)
        error.doc, error.pos, error.lineno, error.colno = None, where, line, column
        return error


def _cut_number(value: Any, text: str, end: int) -> bool:
    """A number read up to the piece's end, or up to a '.', 'e' or '-' the piece ends in, may go on in the next piece:
    read alone, '17650' of '1765080000.5' was 17650 and the rest 'Expecting ',' delimiter'."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and NUMBER_REST.fullmatch(text, end) is not None
