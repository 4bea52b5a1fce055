"""GGUF `llama` vocabularies (SentencePiece BPE: pieces with scores, no merges) as a SentencePiece model.

The model reproduces the ids of a `tokenizers` byte-fallback BPE whose merges are every split of a mergeable piece
(normal, or a user-defined run of spaces) into two mergeable pieces, ranked: space runs first, then by score, then
by id. SentencePiece merges the adjacent pair whose joined piece scores best, so each mergeable piece's score in
the model is minus its rank; a piece holding a character that is no mergeable piece of its own could never be
built by those merges, so the model types it control, which SentencePiece never builds either.
"""
from __future__ import annotations

import numpy as np
from sentencepiece import sentencepiece_model_pb2 as pb

from engine.tokenizer.gguf_vocab import GGUFVocab, TokenType
from engine.tokenizer.sentencepiece_backend import SPACE_MARK, PieceTables, SentencePieceBackend

Piece = pb.ModelProto.SentencePiece
SPECIAL = (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.UNUSED)
MAX_PIECE_BYTES = 7999  # SentencePiece refuses longer pieces
BYTE_TEXTS = {f"<0x{b:02X}>" for b in range(256)}  # the only byte pieces SentencePiece accepts


def build_sentencepiece(vocab: GGUFVocab) -> SentencePieceBackend:
    """The backend for a `llama` vocabulary (`vocab.unk_id` already resolved, as from_gguf does)."""
    space_runs = _space_runs(vocab)
    texts, renamed = _stored_texts(vocab, space_runs)
    mergeable = [i for i, kind in enumerate(vocab.types) if kind == TokenType.NORMAL or i in space_runs]
    tables = PieceTables(
        size=len(vocab.tokens),
        added=_added(vocab, texts, space_runs),
        special=[i for i, (t, kind) in enumerate(zip(vocab.tokens, vocab.types)) if kind in SPECIAL and t],
        renamed=renamed,
        max_token_chars=max(map(len, vocab.tokens)) + 1,
        strip_prefix=vocab.add_space_prefix,
    )
    return SentencePieceBackend(_model(vocab, texts, renamed, mergeable, space_runs), tables)


def _space_runs(vocab: GGUFVocab) -> set[int]:
    """User-defined pieces made only of spaces (Gemma ids 138-167): merged like normal pieces, before them."""
    return {
        i
        for i, (text, kind) in enumerate(zip(vocab.tokens, vocab.types))
        if kind == TokenType.USER_DEFINED and text and not text.strip(" ")
    }


def _stored_texts(vocab: GGUFVocab, space_runs: set[int]) -> tuple[list[str], dict[int, str]]:
    """Each piece's text in the model, and the real text of those stored under a stand-in: SentencePiece refuses
    repeated pieces (a repeated text keeps its first id, as in BPE) and pieces `_storable` rejects."""
    texts = list(vocab.tokens)
    for i in space_runs:  # stored with real spaces, but the model only sees "▁"
        texts[i] = texts[i].replace(" ", SPACE_MARK)
    seen: set[str] = set()
    renamed: dict[int, str] = {}
    for i, text in enumerate(texts):
        if text in seen or not _storable(text):
            renamed[i] = vocab.tokens[i]
        seen.add(text)
    for i in renamed:  # private-use characters nobody types, made unique
        texts[i] = _unused_text(f"\U0010fffd{i}", seen)
        seen.add(texts[i])
    return texts, renamed


def _storable(text: str) -> bool:
    """Not empty, no NUL, valid UTF-8 and short enough: what SentencePiece accepts as a piece."""
    try:
        return 0 < len(text.encode("utf-8")) <= MAX_PIECE_BYTES and "\0" not in text
    except UnicodeEncodeError:  # lone surrogates
        return False


def _unused_text(text: str, seen: set[str]) -> str:
    while text in seen:
        text += "\U0010fffd"
    return text


def _added(vocab: GGUFVocab, texts: list[str], space_runs: set[int]) -> dict[str, int]:
    """Special and user-defined texts (not space runs) -> the first id with that text."""
    first: dict[str, int] = {}
    for i, text in enumerate(texts):
        first.setdefault(text, i)
    kinds = (*SPECIAL, TokenType.USER_DEFINED)
    return {t: first[t] for i, (t, kind) in enumerate(zip(vocab.tokens, vocab.types))
            if t and kind in kinds and i not in space_runs and t in first}


def _model(vocab: GGUFVocab, texts: list[str], renamed: dict[int, str], mergeable: list[int],
           space_runs: set[int]) -> bytes:
    types = _piece_types(vocab, texts, renamed, mergeable)
    byte_fallback = sum(1 for t, kind in zip(texts, types) if kind == Piece.BYTE) == 256
    if not byte_fallback:  # without all 256 bytes, unknown characters become the unknown token instead
        types = [Piece.CONTROL if kind == Piece.BYTE else kind for kind in types]
    scores = np.zeros(len(texts), dtype=np.float32)
    scores[mergeable] = -_ranks(vocab, mergeable, space_runs)
    model = pb.ModelProto()
    model.trainer_spec.model_type = pb.TrainerSpec.BPE
    model.trainer_spec.vocab_size = len(texts)
    model.trainer_spec.byte_fallback = byte_fallback
    # Tokenizer.encode adds the dummy prefix once per text; nothing else is normalised but " " -> "▁".
    model.normalizer_spec.name = "identity"
    model.normalizer_spec.add_dummy_prefix = False
    model.normalizer_spec.remove_extra_whitespaces = False
    model.normalizer_spec.escape_whitespaces = True
    for text, score, kind in zip(texts, scores.tolist(), types):
        model.pieces.add(piece=text, score=score, type=kind)
    if vocab.unk_id is None:  # SentencePiece needs one; this one is never shown to the model (the backend drops it)
        model.pieces.add(piece=_unused_text("\U0010fffd<unk>", set(texts)), type=Piece.UNKNOWN)
    return model.SerializeToString()


def _piece_types(vocab: GGUFVocab, texts: list[str], renamed: dict[int, str], mergeable: list[int]) -> list[int]:
    """NORMAL: the mergeable pieces BPE can build; USER_DEFINED: matched whole in text; BYTE: byte fallback;
    the rest CONTROL (never matched nor built; the backend cuts special tokens out of the text itself)."""
    chars = {texts[i] for i in mergeable if len(texts[i]) == 1}
    types = [Piece.CONTROL] * len(texts)
    for i in mergeable:
        if i not in renamed and all(c in chars for c in texts[i]):
            types[i] = Piece.NORMAL
    merged = set(mergeable)
    for i, (text, kind) in enumerate(zip(texts, vocab.types)):
        if i in renamed:
            continue
        if text in BYTE_TEXTS:  # whatever their type: byte fallback looks them up by text
            types[i] = Piece.BYTE
        elif kind == TokenType.USER_DEFINED and i not in merged:
            types[i] = Piece.USER_DEFINED
    if vocab.unk_id is not None:
        types[vocab.unk_id] = Piece.UNKNOWN
    return types


def _ranks(vocab: GGUFVocab, mergeable: list[int], space_runs: set[int]) -> np.ndarray:
    """Each mergeable piece's place in the merge order: space runs first, then the best score, then the lowest id
    (float32 is exact below 2**24 pieces)."""
    ids = np.asarray(mergeable, dtype=np.int64)
    later = np.fromiter((i not in space_runs for i in mergeable), dtype=bool, count=len(mergeable))
    score = np.asarray(vocab.scores, dtype=np.float64)[ids]
    ranks = np.empty(len(ids), dtype=np.float32)
    ranks[np.lexsort((ids, -score, later))] = np.arange(len(ids), dtype=np.float32)
    return ranks
