"""A `tokenizers` model (byte-level BPE from GGUF, any Hugging Face tokenizer.json) as a TokenizerBackend."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from engine.tokenizer.backend import literal_pattern

MODEL_FILE = "tokenizer.json"
GIL_FREE_CHARS = 16_384  # longer texts go through encode_batch, which lets other threads run meanwhile
NOTHING = re.compile(r"(?!)")  # matches nowhere: a vocabulary without added tokens


class HFBackend:
    """Encodes with a `tokenizers.Tokenizer`; its added special tokens are the special tokens."""

    FILES = (MODEL_FILE,)

    def __init__(self, hf: HFTokenizer) -> None:
        self.hf = hf  # the `tokenizers.Tokenizer` itself, for inspection
        self._copies: dict[tuple[bool, bool], HFTokenizer] = {(False, True): hf}  # (literal, prefix) -> tokenizer
        added = hf.get_added_tokens_decoder()
        self.special_pattern = literal_pattern(t.content for t in added.values() if t.special)
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self.max_token_chars = longest_token(hf, added) + 1
        # the added tokens each mode cuts out of the text (the literal one reads special tokens as plain text)
        self._cut = {False: literal_pattern(t.content for t in added.values()) or NOTHING,
                     True: literal_pattern(t.content for t in added.values() if not t.special) or NOTHING}

    def encode(self, text: str, literal: bool = False, start: bool = True) -> list[int]:
        whole = self._copy(literal, True)
        if start or self._copy(literal, False) is whole:
            return self._encode(whole, text)
        # A continuation: its text up to the first added token gets no dummy prefix; after that token the
        # tokenizer's own rules apply, as they would in one pass over the whole text.
        cut = self._cut[literal].search(text)
        at = cut.start() if cut else len(text)
        head = self._encode(self._copy(literal, False), text[:at]) if at else []
        return head + (self._encode(whole, text[at:]) if at < len(text) else [])

    @staticmethod
    def _encode(hf: HFTokenizer, text: str) -> list[int]:
        if len(text) > GIL_FREE_CHARS:  # `encode` holds the GIL throughout: the engine thread would stall
            return hf.encode_batch([text], add_special_tokens=False)[0].ids
        return hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    def _copy(self, literal: bool, prefix: bool) -> HFTokenizer:
        """The tokenizer that reads control-token text as plain text (`literal`) and places a dummy prefix
        (`prefix`); built once each."""
        if (literal, prefix) not in self._copies:
            data = json.loads(self.hf.to_str())
            if not prefix and _without_prefix(data) == data:  # nothing adds one (Llama 3, Qwen): no second copy
                self._copies[literal, prefix] = self._copy(literal, True)
                return self._copies[literal, prefix]
            copy = HFTokenizer.from_str(json.dumps(data if prefix else _without_prefix(data)))
            copy.encode_special_tokens = literal
            self._copies[literal, prefix] = copy
        return self._copies[literal, prefix]

    def save(self, directory: Path) -> None:
        (Path(directory) / MODEL_FILE).write_text(_compact_json(self.hf), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> "HFBackend":
        return cls(HFTokenizer.from_file(str(Path(directory) / MODEL_FILE)))


def longest_token(hf: HFTokenizer, added: dict[int, Any]) -> int:
    """The length of the longest stored token, asked id by id: `get_vocab` builds a dict of the whole vocabulary in one
    call that holds the interpreter (0.27-0.3 s for 151,300 tokens, while the app's window waited; 15 ms at most
    between ids here). Where ids leave holes (a hand-made tokenizer.json) that dict is the only complete list."""
    n = max(hf.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
    if n == 0:
        return 1
    longest, token_of = 0, hf.id_to_token
    for i in range(n):
        token = token_of(i)
        if token is None:
            return max(map(len, hf.get_vocab(with_added_tokens=True)), default=1)
        if len(token) > longest:
            longest = len(token)
    return longest


def _without_prefix(data: dict[str, Any]) -> dict[str, Any]:
    """tokenizer.json whose normalizer and pre-tokenizer add no dummy prefix (a Prepend("▁") normalizer, Metaspace's
    prepend scheme, ByteLevel's add_prefix_space): for text that continues text encoded before it."""
    return {**data, "normalizer": _no_prefix_step(data.get("normalizer")),
            "pre_tokenizer": _no_prefix_step(data.get("pre_tokenizer"))}


def _no_prefix_step(step: Any) -> Any:
    if not isinstance(step, dict):
        return step
    kind = step.get("type")
    if kind == "Prepend":
        return {"type": "Sequence", "normalizers": []}
    if kind == "Sequence":
        key = "normalizers" if "normalizers" in step else "pretokenizers"
        return {**step, key: [_no_prefix_step(s) for s in step.get(key) or []]}
    if kind == "Metaspace":
        return {**step, "prepend_scheme": "never", "add_prefix_space": False}
    if kind == "ByteLevel":
        return {**step, "add_prefix_space": False}
    return step


def _compact_json(hf: HFTokenizer) -> str:
    """tokenizer.json with merges as "a b" strings, which `from_file` reads about twice as fast.

    The string form cannot hold a piece containing a space, so such vocabularies keep pairs.
    """
    data = json.loads(hf.to_str())
    merges = data.get("model", {}).get("merges")
    if merges and all(isinstance(m, list) and " " not in m[0] + m[1] for m in merges):
        data["model"]["merges"] = [f"{left} {right}" for left, right in merges]
    return json.dumps(data, ensure_ascii=False)
