"""A `tokenizers` model (byte-level BPE from GGUF, any Hugging Face tokenizer.json) as a TokenizerBackend."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from engine.tokenizer.backend import literal_pattern

MODEL_FILE = "tokenizer.json"
GIL_FREE_CHARS = 16_384  # longer texts go through encode_batch, which lets other threads run meanwhile


class HFBackend:
    """Encodes with a `tokenizers.Tokenizer`; its added special tokens are the special tokens."""

    FILES = (MODEL_FILE,)

    def __init__(self, hf: HFTokenizer) -> None:
        self.hf = hf  # the `tokenizers.Tokenizer` itself, for inspection
        self._literal: HFTokenizer | None = None  # a copy that reads control-token text as plain text
        added = hf.get_added_tokens_decoder()
        self.special_pattern = literal_pattern(t.content for t in added.values() if t.special)
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self.max_token_chars = max(map(len, hf.get_vocab(with_added_tokens=True)), default=1) + 1

    def encode(self, text: str, literal: bool = False, start: bool = True) -> list[int]:
        del start  # a tokenizer.json's own normalizer places any prefix
        hf = self._literal_copy() if literal else self.hf
        if len(text) > GIL_FREE_CHARS:  # `encode` holds the GIL throughout: the engine thread would stall
            return hf.encode_batch([text], add_special_tokens=False)[0].ids
        return hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    def _literal_copy(self) -> HFTokenizer:
        if self._literal is None:
            literal = HFTokenizer.from_str(self.hf.to_str())
            literal.encode_special_tokens = True
            self._literal = literal
        return self._literal

    def save(self, directory: Path) -> None:
        (Path(directory) / MODEL_FILE).write_text(_compact_json(self.hf), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> "HFBackend":
        return cls(HFTokenizer.from_file(str(Path(directory) / MODEL_FILE)))


def _compact_json(hf: HFTokenizer) -> str:
    """tokenizer.json with merges as "a b" strings, which `from_file` reads about twice as fast.

    The string form cannot hold a piece containing a space, so such vocabularies keep pairs.
    """
    data = json.loads(hf.to_str())
    merges = data.get("model", {}).get("merges")
    if merges and all(isinstance(m, list) and " " not in m[0] + m[1] for m in merges):
        data["model"]["merges"] = [f"{left} {right}" for left, right in merges]
    return json.dumps(data, ensure_ascii=False)
