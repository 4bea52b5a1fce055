"""GGUF `llama` vocabularies (SentencePiece BPE: scores, no merges) as a `tokenizers` BPE.

Parley's former construction (checked against transformers and SentencePiece), kept as the reference that
engine/tokenizer/sentencepiece_model.py must reproduce id for id: it held ~80 MB for Gemma 3's vocabulary.
"""
from __future__ import annotations

from array import array
from typing import Any

import numpy as np
from tokenizers import Tokenizer as Backend, decoders, normalizers
from tokenizers.models import BPE

from engine.errors import TokenizerError
from engine.tokenizer import Tokenizer
from engine.tokenizer.from_gguf import _unknown_id, gguf_tokenizer_info
from engine.tokenizer.gguf_vocab import GGUFVocab, TokenType, vocab_from_metadata
from engine.tokenizer.hf_backend import HFBackend

SPACE_MARK = "\u2581"  # "▁", SentencePiece's visible space
MAX_SPLIT_WORK = 1 << 29  # characters sliced while deriving merges: real vocabularies need under 1% of it


def build_sentencepiece_bpe(vocab: GGUFVocab) -> Backend:
    """A byte-fallback BPE whose merge order follows the SentencePiece scores."""
    space_runs = _space_runs(vocab)
    pieces = _pieces(vocab, space_runs)
    mergeable = [i for i, kind in enumerate(vocab.types) if kind == TokenType.NORMAL or i in space_runs]
    model = BPE(
        vocab=_piece_ids(pieces),
        merges=_merges_from_scores(pieces, mergeable, vocab),
        unk_token=pieces[vocab.unk_id] if vocab.unk_id is not None else None,
        byte_fallback=True,
        fuse_unk=True,
    )
    backend = Backend(model)
    # The dummy-prefix space (add_space_prefix) before every stretch of text between added tokens, as llama.cpp.
    replace = normalizers.Replace(" ", SPACE_MARK)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE_MARK), replace]) \
        if vocab.add_space_prefix else replace
    backend.decoder = _decoder(vocab.add_space_prefix)
    added = vocab.added_tokens(skip=space_runs)
    backend.add_special_tokens([t for t in added if t.special])
    backend.add_tokens([t for t in added if not t.special])
    return backend


def _space_runs(vocab: GGUFVocab) -> set[int]:
    """User-defined pieces made only of spaces (Gemma ids 138-167)."""
    return {
        i
        for i, (text, kind) in enumerate(zip(vocab.tokens, vocab.types))
        if kind == TokenType.USER_DEFINED and text and not text.strip(" ")
    }


def _pieces(vocab: GGUFVocab, space_runs: set[int]) -> list[str]:
    # Space runs are stored with real spaces but BPE only ever sees normalised text ("▁").
    pieces = list(vocab.tokens)
    for i in space_runs:
        pieces[i] = pieces[i].replace(" ", SPACE_MARK)
    return pieces


def _piece_ids(pieces: list[str]) -> dict[str, int]:
    ids: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        ids.setdefault(piece, i)  # a duplicate keeps its first id, as SentencePiece does
    return ids


def _merges_from_scores(pieces: list[str], mergeable: list[int], vocab: GGUFVocab) -> list[tuple[str, str]]:
    """Every split of a mergeable piece (normal or space run; never control, user-defined text or
    bytes, which are matched whole) into two mergeable pieces, best-scored result first.

    SentencePiece merges the pair whose result scores highest; BPE ranks merges, so the rank is
    the result's score. Whitespace runs come first because SentencePiece matches user-defined
    pieces before merging; among splits of one piece the longer left part goes first. The splits are
    ranked as integer arrays and their strings made once, in order (a 262k-token vocabulary has ~500k
    merges: ranking them as Python tuples was ~0.4 s slower).
    """
    known = {pieces[i] for i in mergeable}
    work = sum(len(pieces[i]) ** 2 for i in mergeable)  # every cut of every piece slices it whole
    if work > MAX_SPLIT_WORK:
        raise TokenizerError("The tokenizer's vocabulary has too many long pieces to derive its merges in time.")
    ids, cuts = array("i"), array("i")
    for i in mergeable:
        piece = pieces[i]
        for cut in range(len(piece) - 1, 0, -1):
            if piece[:cut] in known and piece[cut:] in known:
                ids.append(i)
                cuts.append(cut)
    ids_np, cuts_np = np.frombuffer(ids, dtype=np.int32), np.frombuffer(cuts, dtype=np.int32)
    later = np.asarray(vocab.types, dtype=np.int64)[ids_np] != TokenType.USER_DEFINED  # space runs first
    score = np.asarray(vocab.scores, dtype=np.float64)[ids_np]
    order = np.lexsort((-cuts_np, ids_np, -score, later))  # the last key sorts first
    return [(pieces[i][:cut], pieces[i][cut:]) for i, cut in zip(ids_np[order].tolist(), cuts_np[order].tolist())]


def _decoder(strip_prefix: bool) -> decoders.Decoder:
    steps = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    return decoders.Sequence(steps)


def reference_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """The tokenizer `tokenizer_from_gguf` built for a `llama` vocabulary before it used SentencePiece."""
    vocab = vocab_from_metadata(metadata)
    vocab.unk_id = _unknown_id(vocab)
    backend = HFBackend(build_sentencepiece_bpe(vocab))
    return Tokenizer(backend, gguf_tokenizer_info(vocab, metadata, backend))
