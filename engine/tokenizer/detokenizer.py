"""Streaming detokenisation: text for each new token, without broken characters; and the tail of streamed text that
may begin a marker (a stop string, a tag), held until the marker completes or cannot."""
from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"
MAX_HELD = 16  # ids held back at most before settling them: a character spans 4 byte tokens at most
KEEP = 4  # ids a settle leaves held back: they may still begin a character


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces whose concatenation equals decode(all ids).

    Each push decodes a short window of recent ids and returns only what is new, so leading-space
    markers, byte-fallback sequences and decoder quirks are handled exactly as a full decode would.
    Text that ends in an incomplete UTF-8 sequence is held back until the sequence completes.
    """

    def __init__(self, decode: Callable[[list[int], bool], str], skip_special: bool = True,
                 context: list[int] | tuple[int, ...] = ()) -> None:
        """`context`: ids already shown (the end of an answer being continued); their text is not emitted,
        but the first new id decodes as it would after them (a leading space stays a space)."""
        self._decode = decode
        self._skip_special = skip_special
        self._ids: list[int] = list(context)  # the window: ids whose text was emitted last, then those held back
        self._read = len(self._ids)  # ids before this index have had their text emitted
        self._pieces: list[str] = []  # joined when read: `str +=` on an attribute copies the whole text each time

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return joined(self._pieces)

    def push(self, token_id: int) -> str:
        """Adds one id and returns the text it completes (possibly empty)."""
        self._ids.append(token_id)
        new = self._pending(len(self._ids))
        if new and not new.endswith(REPLACEMENT):
            return self._emit(new, len(self._ids))
        if len(self._ids) - self._read > MAX_HELD:  # a long run of invalid bytes or skipped tokens
            return self._settle()
        return ""

    def flush(self) -> str:
        """Returns whatever is held back; incomplete byte sequences become U+FFFD."""
        new = self._pending(len(self._ids))
        return self._emit(new, len(self._ids)) if new else ""

    def _pending(self, end: int) -> str:
        done = self._decode(self._ids[: self._read], self._skip_special)
        full = self._decode(self._ids[:end], self._skip_special)
        # Decoding more ids only appends text: the window already emitted is a prefix of the longer one.
        return full[len(done) :]

    def _settle(self) -> str:
        """Emits the held ids but the last few, or drops them where they add no text, so that the window (and the
        cost of each push) stays short however long a run of U+FFFD or skipped control tokens grows."""
        cut = len(self._ids) - KEEP
        full = self._decode(self._ids, self._skip_special)
        head = self._decode(self._ids[:cut], self._skip_special)
        if not full.startswith(head):  # a character runs across the cut: it completes within the kept ids
            return ""
        done = self._decode(self._ids[: self._read], self._skip_special)
        if len(head) > len(done):
            return self._emit(head[len(done) :], cut)
        if self._decode(self._ids[: self._read] + self._ids[cut:], self._skip_special) == full:
            del self._ids[self._read : cut]  # they show nothing, and nothing after them changes without them
        return ""

    def _emit(self, new: str, end: int) -> str:
        del self._ids[: self._read]  # the ids just emitted stay as the next window's context
        self._read = end - self._read
        self._pieces.append(new)
        return new


def partial_suffix(text: str, markers) -> int:
    """Length of the longest suffix of `text` that begins one of `markers` (the whole marker excluded: it is found)."""
    for n in range(min(len(text), max(map(len, markers), default=1) - 1), 0, -1):
        if any(n < len(m) and m.startswith(text[-n:]) for m in markers):
            return n
    return 0


def joined(pieces: list[str]) -> str:
    """The pieces as one string, kept as the list's only piece so that reading it again costs nothing."""
    if len(pieces) > 1:
        pieces[:] = ["".join(pieces)]
    return pieces[0] if pieces else ""
