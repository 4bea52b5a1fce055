"""The tokenizer part of GGUF metadata, read and checked once."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from tokenizers import AddedToken

from engine.errors import TokenizerError

# The longest pieces of real vocabularies are runs of spaces or dashes, a few hundred characters at most; building
# a tokenizer costs about the square of a piece's length, so a 1 MB "token" would hang the load.
MAX_TOKEN_CHARS = 4096
MAX_VOCAB_CHARS = 64 << 20


class TokenType(IntEnum):
    """GGUF `tokenizer.ggml.token_type` values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass(slots=True)
class GGUFVocab:
    """Token strings, types, scores and merges as stored under `tokenizer.ggml.*`."""

    model: str
    tokens: list[str]
    types: list[int]
    scores: list[float]
    merges: list[str]
    pre: str
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    add_bos: bool
    add_space_prefix: bool
    extra_stop_ids: list[int]
    fim_ids: tuple[int | None, ...] = (None, None, None)  # fill-in-the-middle markers: prefix, suffix, middle

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0:
            raise TokenizerError("The model file has no tokenizer vocabulary (tokenizer.ggml.tokens is missing).")
        longest = max(range(n), key=lambda i: len(self.tokens[i]))
        if len(self.tokens[longest]) > MAX_TOKEN_CHARS:
            raise TokenizerError(f"Tokenizer token {longest} is {len(self.tokens[longest]):,} characters long; "
                                 f"at most {MAX_TOKEN_CHARS:,} are accepted.")
        if sum(map(len, self.tokens)) + sum(map(len, self.merges)) > MAX_VOCAB_CHARS:
            raise TokenizerError(f"The tokenizer's vocabulary holds more than {MAX_VOCAB_CHARS:,} characters.")
        if len(self.types) != n or len(self.scores) != n:
            raise TokenizerError(f"Tokenizer metadata disagrees: {n} tokens but {len(self.types)} types and {len(self.scores)} scores.")
        for name, token_id in (("bos", self.bos_id), ("eos", self.eos_id), ("unknown", self.unk_id)):
            if token_id is not None and not 0 <= token_id < n:
                raise TokenizerError(f"The {name} token id {token_id} is outside the {n}-token vocabulary.")
        self.extra_stop_ids = [i for i in self.extra_stop_ids if 0 <= i < n]
        self.fim_ids = tuple(i if i is not None and i < n else None for i in self.fim_ids)

    def added_tokens(self, skip: set[int] = frozenset()) -> list[AddedToken]:
        """Control, unknown and unused tokens as special added tokens; user-defined as plain ones.

        Added tokens are matched in raw text before the model runs, which is how llama.cpp and
        SentencePiece treat them (e.g. "<start_of_turn>" typed in a prompt is one id).
        """
        special = {TokenType.CONTROL, TokenType.UNKNOWN, TokenType.UNUSED}
        out = []
        for i, (text, kind) in enumerate(zip(self.tokens, self.types)):
            if i in skip or not text or (kind not in special and kind != TokenType.USER_DEFINED):
                continue
            out.append(AddedToken(text, special=kind in special, normalized=False))
        return out


def vocab_from_metadata(metadata: dict[str, Any]) -> GGUFVocab:
    """Reads `tokenizer.ggml.*`; missing optional keys get llama.cpp's defaults."""
    try:
        return _vocab(metadata)
    except (TypeError, ValueError, OverflowError) as exc:  # a list where an id belongs, text where a score does
        raise TokenizerError(f"The model's tokenizer metadata holds a value of the wrong kind: {exc}.") from None


def _vocab(metadata: dict[str, Any]) -> GGUFVocab:
    model = str(metadata.get("tokenizer.ggml.model", ""))
    tokens = [str(t) for t in metadata.get("tokenizer.ggml.tokens") or []]
    n = len(tokens)
    return GGUFVocab(
        model=model,
        tokens=tokens,
        types=[int(t) for t in metadata.get("tokenizer.ggml.token_type") or [TokenType.NORMAL] * n],
        scores=[float(s) for s in metadata.get("tokenizer.ggml.scores") or [0.0] * n],
        merges=[str(m) for m in metadata.get("tokenizer.ggml.merges") or []],
        pre=str(metadata.get("tokenizer.ggml.pre", "default")),
        bos_id=_optional_int(metadata.get("tokenizer.ggml.bos_token_id")),
        eos_id=_optional_int(metadata.get("tokenizer.ggml.eos_token_id")),
        unk_id=_optional_int(metadata.get("tokenizer.ggml.unknown_token_id")),
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", model == "llama")),
        add_space_prefix=bool(metadata.get("tokenizer.ggml.add_space_prefix", model == "llama")),
        extra_stop_ids=[
            int(metadata[key])
            for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.fim_pad_token_id",
                        "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id")
            if metadata.get(key) is not None
        ],
        fim_ids=tuple(_optional_int(metadata.get(f"tokenizer.ggml.fim_{part}_token_id"))
                      for part in ("pre", "suf", "mid")),
    )


def _optional_int(value: Any) -> int | None:
    # Some converters write -1 (as an unsigned max) for "no such token".
    if value is None or int(value) < 0 or int(value) >= 2**31:
        return None
    return int(value)
