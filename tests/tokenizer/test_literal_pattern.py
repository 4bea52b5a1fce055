"""literal_pattern: one regex for a vocabulary's added tokens, found longest first; built on every model's load."""
from __future__ import annotations

import random

from engine.tokenizer.backend import literal_pattern


def _longest_first(texts: list[str], text: str) -> list[tuple[int, int]]:
    """Where `texts` occur in `text`, left to right, the longest at each place: what literal_pattern must find."""
    known, lengths, out, i = set(texts), sorted({len(t) for t in texts}, reverse=True), [], 0
    while i < len(text):
        n = next((n for n in lengths if i + n <= len(text) and text[i:i + n] in known), 0)
        out += [(i, i + n)] if n else []
        i += n or 1
    return out


def test_added_tokens_that_end_alike_share_one_branch_of_their_regex():
    """Gemma's thousands of <unusedN> tokens made a trie regex of 22,163 characters (three per load, compiled in Python
    while the window waited: 36-85 ms each, and ~25,000 trie objects for the window's thread to collect); branches
    that end alike now share a character class. The matches are the same: the longest token at each place."""
    texts = [f"<unused{i}>" for i in range(6242)] + ["<start_of_turn>", "<end_of_turn>", "<pad>", "<unused>", "\n\n",
                                                     "\n\n\n", "a-b", "a]b", "^x", "\\y", "[z", "-", "]", "^", "\\",
                                                     "\U0010ffff", "\U0010ffffa", "\U0010fffe"]
    pattern = literal_pattern(texts)
    assert len(pattern.pattern) < 1500, len(pattern.pattern)  # 21,328 as a trie of single characters
    rng = random.Random(0)
    pool = texts[-23:] + ["<unused", "<unused12", "3>", "<", ">", "x", "\n", "-", "]", "a"]
    for _ in range(2000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 10)))
        assert [m.span() for m in pattern.finditer(text)] == _longest_first(texts, text), text
