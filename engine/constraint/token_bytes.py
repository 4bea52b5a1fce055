"""Each token's bytes, the form llguidance matches grammars against, for every tokenizer backend Parley builds."""
from __future__ import annotations

from llguidance import LLTokenizer, TokenizerWrapper

from engine.tokenizer.hf_backend import HFBackend
from engine.tokenizer.sentencepiece_backend import BYTE_PIECE, SPACE_MARK, SentencePieceBackend
from engine.tokenizer.tokenizer import Tokenizer

SPECIAL_MARK = b"\xff"  # llguidance's prefix for a control token: never matched by grammar text


def grammar_tokenizer(tokenizer: Tokenizer, n_vocab: int) -> LLTokenizer:
    """The model's vocabulary as llguidance reads it; `n_vocab`: the logits' width (padded ids are never allowed).
    The model's stop tokens end a grammar's text. About 1.5 s for a 262,144-token vocabulary: build once per model."""
    backend, stops = tokenizer.backend, sorted(tokenizer.stop_ids)
    if isinstance(backend, HFBackend):  # llguidance reads a `tokenizers` JSON (byte-level or metaspace) itself
        return LLTokenizer(backend.hf.to_str(), n_vocab=n_vocab, eos_token=stops)
    if isinstance(backend, SentencePieceBackend):
        return LLTokenizer(TokenizerWrapper(_PieceVocabulary(tokenizer)), n_vocab=n_vocab, eos_token=stops)
    raise TypeError(f"no byte table for a {type(backend).__name__} tokenizer")


def sentencepiece_bytes(backend: SentencePieceBackend, size: int) -> list[bytes]:
    """Per id: a byte piece's byte, a control token's text behind SPECIAL_MARK, else the piece with its visible
    spaces as spaces (the dummy prefix is the grammar's business: JSON allows the space, or the mask drops it)."""
    out = []
    for i in range(size):
        piece = backend.id_to_token(i) or ""
        byte = BYTE_PIECE.fullmatch(piece)
        if i in backend.special_ids:
            out.append(SPECIAL_MARK + piece.encode("utf-8"))
        elif byte:
            out.append(bytes([int(byte.group(1).replace("+", ""), 16)]))
        else:
            out.append(piece.replace(SPACE_MARK, " ").encode("utf-8"))
    return out


class _PieceVocabulary:
    """What llguidance's TokenizerWrapper reads from a tokenizer: ids' bytes, end and start ids, an encoder."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        backend = tokenizer.backend
        self.tokens = sentencepiece_bytes(backend, tokenizer.vocab_size)
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = sorted(backend.special_ids)
        self._encode = backend.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text, literal=True, start=False)  # a grammar's text: control tags are plain text here
