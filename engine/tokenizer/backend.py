"""What a Tokenizer needs from the model that maps text to ids: `tokenizers` (hf_backend) or SentencePiece."""
from __future__ import annotations

import re
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
    about the text's length, not times the number of strings (Gemma has thousands of control tokens)."""
    texts = sorted({t for t in texts if t}, key=len, reverse=True)
    if not texts:
        return None
    if len(texts[0]) > 300:  # deeper than the regex compiler's recursion allows
        return re.compile("|".join(map(re.escape, texts)))
    trie: dict = {}
    for text in texts:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}
    return re.compile(_trie_regex(trie))


def _trie_regex(node: dict) -> str:
    alts = [re.escape(ch) + _trie_regex(child) for ch, child in node.items() if ch]
    if not alts:
        return ""
    body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
    return f"(?:{body})?" if "" in node else body  # a token that is a prefix of a longer one: longest first
