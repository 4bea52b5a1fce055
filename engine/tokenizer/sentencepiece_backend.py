"""GGUF `llama` vocabularies encoded by SentencePiece itself (built by sentencepiece_model.py).

Its BPE holds Gemma 3's 262,144 pieces in ~43 MB resident, where a `tokenizers` BPE with the 513,976 merges
derived from their scores held ~76 MB (the whole tokenizer: ~58 MB instead of ~83 MB; its build peaks at ~83 MB
instead of ~270 MB). Ids, decoded text and special-token handling are those of that BPE.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sentencepiece import SentencePieceProcessor

from engine.tokenizer.backend import literal_pattern

MODEL_FILE = "tokenizer.model"
TABLES_FILE = "sentencepiece_tables.json"
SPACE_MARK = "\u2581"  # "▁", SentencePiece's visible space
# A byte piece as `tokenizers`' ByteFallback decoder reads one (Rust's u8::from_str_radix takes a "+" sign).
NOTHING = re.compile(r"(?!)")  # matches nowhere: a vocabulary without added tokens
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2}|\+[0-9A-Fa-f])>")


@dataclass(slots=True)
class PieceTables:
    """What the SentencePiece model does not say about the GGUF vocabulary, saved beside it."""

    size: int  # tokens in the GGUF vocabulary; a stand-in unknown piece may follow them in the model
    added: dict[str, int]  # special and user-defined token texts, matched in raw text before the model runs
    special: list[int]  # ids that decode may skip: control, unknown and unused tokens
    renamed: dict[int, str] = field(default_factory=dict)  # ids the model stores under a stand-in text: real text
    max_token_chars: int = 1  # the most characters one token stands for, plus one
    strip_prefix: bool = False  # the dummy prefix: encode adds a space (see SentencePieceBackend), decode drops one

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "PieceTables":
        data = json.loads(text)
        data["renamed"] = {int(i): t for i, t in data["renamed"].items()}  # JSON keys are strings
        return cls(**data)


class SentencePieceBackend:
    """Special and user-defined token texts are cut out first (longest match first, as `tokenizers` matches its
    added tokens); SentencePiece encodes the text between them. The literal path cuts out user-defined ones only
    (llama.cpp's rule for text whose control tokens are not parsed).

    With the dummy prefix (GGUF `add_space_prefix`), a space goes before every stretch of text that starts the
    sequence or follows an added token, as llama.cpp and a legacy `tokenizers` normaliser place it: "<s>[INST]" is
    `<s> ▁[INST]`, never `▁ <s> [INST]`, and "a</s>b" ends `</s> ▁b`."""

    FILES = (MODEL_FILE, TABLES_FILE)

    def __init__(self, model: bytes, tables: PieceTables) -> None:
        self._sp = SentencePieceProcessor(model_proto=model)
        self._tables = tables
        self._special = self.special_ids = frozenset(tables.special)
        self._added = literal_pattern(tables.added) or NOTHING
        self._user_defined = literal_pattern(t for t, i in tables.added.items() if i not in self._special) or NOTHING
        self.special_pattern = literal_pattern(t for t, i in tables.added.items() if i in self._special)
        self.max_token_chars = tables.max_token_chars
        # the stand-in unknown piece after the vocabulary, when there is one: never an id the model may see
        self._stand_in = tables.size if self._sp.get_piece_size() > tables.size else None

    def encode(self, text: str, literal: bool = False, start: bool = True) -> list[int]:
        ids, at = [], 0
        for match in (self._user_defined if literal else self._added).finditer(text):
            ids += self._sp.encode(self._prefixed(text[at : match.start()], start))
            ids.append(self._tables.added[match.group()])
            at, start = match.end(), True
        ids += self._sp.encode(self._prefixed(text[at:], start))
        return ids if self._stand_in is None else [i for i in ids if i != self._stand_in]

    def _prefixed(self, text: str, lead: bool) -> str:
        return " " + text if lead and text and self._tables.strip_prefix else text

    def decode(self, ids: list[int], skip_special: bool) -> str:
        ids = [i for i in ids if 0 <= i < self._tables.size and not (skip_special and i in self._special)]
        pieces = self._sp.id_to_piece(ids)
        if self._tables.renamed:
            pieces = [self._tables.renamed.get(i, piece) for i, piece in zip(ids, pieces)]
        return join_pieces(pieces, self._tables.strip_prefix)

    def token_to_id(self, token: str) -> int | None:
        token_id = self._sp.piece_to_id(token)  # the unknown id when there is no such piece
        if self.id_to_token(token_id) == token:
            return token_id
        return next((i for i, text in self._tables.renamed.items() if text == token), None)

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id < self._tables.size:
            return None
        if token_id in self._tables.renamed:
            return self._tables.renamed[token_id]
        return self._sp.id_to_piece(token_id)

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        (directory / MODEL_FILE).write_bytes(self._sp.serialized_model_proto())
        (directory / TABLES_FILE).write_text(self._tables.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> "SentencePieceBackend":
        directory = Path(directory)
        tables = PieceTables.from_json((directory / TABLES_FILE).read_text(encoding="utf-8"))
        return cls((directory / MODEL_FILE).read_bytes(), tables)


def join_pieces(pieces: list[str], strip_prefix: bool) -> str:
    """Pieces as text, as `tokenizers`' decoders Replace("▁", " "), ByteFallback, Fuse and Strip make it."""
    out: list[str] = []
    run = bytearray()  # consecutive byte pieces, decoded together
    for piece in pieces:
        piece = piece.replace(SPACE_MARK, " ")
        byte = BYTE_PIECE.fullmatch(piece) if piece.startswith("<0x") else None
        if byte:
            run.append(int(byte.group(1), 16))
            continue
        if run:
            out.append(_utf8(run))
            run.clear()
        out.append(piece)
    if run:
        out.append(_utf8(run))
    text = "".join(out)
    return text[1:] if strip_prefix and text.startswith(" ") else text


def _utf8(run: bytearray) -> str:
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)  # ByteFallback marks every byte of a run that is not valid UTF-8
