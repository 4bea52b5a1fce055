"""What a Tokenizer needs from the model that maps text to ids: `tokenizers` (hf_backend) or SentencePiece."""
from __future__ import annotations

import re
import sys
from bisect import bisect_left
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol


class TokenizerBackend(Protocol):
    """Text <-> ids for one vocabulary. `Tokenizer` adds bos, chat templates and streaming."""

    special_pattern: re.Pattern | None  # the special tokens' texts, longest match first (None: there are none)
    max_token_chars: int  # the most characters one token stands for, plus one
    special_ids: frozenset[int]  # the ids `decode(..., skip_special=True)` leaves out

    def encode(self, text: str, literal: bool = False, start: bool = True) -> list[int]:
        """Ids for `text`, special-token texts as their ids; `literal` reads them as plain text instead. `start`: the
        text begins the sequence (not a continuation of text encoded before it), where a dummy prefix may go."""
        ...

    def decode(self, ids: list[int], skip_special: bool) -> str:
        """Text for `ids`; with `skip_special`, control tokens such as <bos> are left out."""
        ...

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry written as stored, or None."""
        ...

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry for an id as stored, or None when out of range."""
        ...

    def save(self, directory: Path) -> None:
        """Writes the backend's files into `directory` (its class's `load` reads them back)."""
        ...


def literal_pattern(texts: Iterable[str]) -> re.Pattern | None:
    """One regex for many literal strings, longest match first, or None for none. Built as a trie: a search costs
    about the text's length, not times the number of strings (Gemma has thousands of control tokens). Branches that
    end alike share one character class ("<unused1" .. "<unused5" followed by the same digits: `<unused[1-5]...`): the
    embedded Gemma's 6,384 added tokens make 1,159 characters of regex instead of 22,163, whose compile (Python, on a
    model's load, beside the app's window) took 36-85 ms each time, and whose dict-of-dicts trie made ~25,000 objects
    for the window's thread to collect."""
    texts = sorted({t for t in texts if t})
    if not texts:
        return None
    if max(map(len, texts)) > 300:  # deeper than the regex compiler's recursion allows
        return re.compile("|".join(map(re.escape, sorted(texts, key=len, reverse=True))))
    return re.compile(_branches(texts, 0))


def _branches(texts: list[str], depth: int) -> str:
    """The regex for sorted `texts` that share their first `depth` characters, from there on."""
    if len(texts) == 1:
        return re.escape(texts[0][depth:])
    ends = len(texts[0]) == depth  # sorted: a text that ends here comes first
    leads: dict[str, list[str]] = {}  # what follows a character -> the characters it follows
    i = 1 if ends else 0
    while i < len(texts):
        ch = texts[i][depth]
        after = ord(ch) + 1  # past the texts with `ch` here (none sorts after the last code point)
        j = bisect_left(texts, texts[i][:depth] + chr(after), i) if after <= sys.maxunicode else len(texts)
        leads.setdefault(_branches(texts[i:j], depth + 1), []).append(ch)
        i = j
    alts = [_one_of(chars) + rest for rest, chars in leads.items()]
    body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
    return f"(?:{body})?" if ends else body  # a text that is a prefix of a longer one: longest first


def _one_of(chars: list[str]) -> str:
    if len(chars) == 1:
        return re.escape(chars[0])
    return "[" + "".join("\\" + c if c in "\\]^-[" else c for c in chars) + "]"
