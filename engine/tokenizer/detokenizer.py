"""Streaming detokenisation: text for each new token, without broken characters."""
from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"


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
        self._ids: list[int] = list(context)
        self._prefix = 0  # start of the context window; its text up to _read has been emitted
        self._read = len(self._ids)  # ids before this index have had their text emitted
        self.text = ""

    def push(self, token_id: int) -> str:
        """Adds one id and returns the text it completes (possibly empty)."""
        self._ids.append(token_id)
        new = self._pending()
        if not new or new.endswith(REPLACEMENT):
            return ""
        return self._emit(new)

    def flush(self) -> str:
        """Returns whatever is held back; incomplete byte sequences become U+FFFD."""
        new = self._pending()
        return self._emit(new) if new else ""

    def _pending(self) -> str:
        done = self._decode(self._ids[self._prefix : self._read], self._skip_special)
        full = self._decode(self._ids[self._prefix :], self._skip_special)
        # Decoding more ids only appends text: the window already emitted is a prefix of the longer one.
        return full[len(done) :]

    def _emit(self, new: str) -> str:
        self._prefix, self._read = self._read, len(self._ids)
        self.text += new
        return new

