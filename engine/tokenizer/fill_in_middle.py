"""Fill-in-the-middle: the marker tokens a code model was trained with, named by its GGUF file or found in its
vocabulary, and the prompt that asks it for the text between a prefix and a suffix, built as ids (the markers never
pass through text)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class FimFormat:
    """A family's markers: prefix, suffix, and middle (None where the family writes none); `suffix_first`: the
    suffix goes before the prefix (Mistral's order), else prefix-suffix-middle, as llama.cpp's infill writes it."""

    prefix: str
    suffix: str
    middle: str | None = None
    suffix_first: bool = False
    ids: tuple[int, ...] = ()  # the markers' ids where the model file names them; else each text's id

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.prefix, self.suffix) + ((self.middle,) if self.middle else ())


FORMATS = (
    FimFormat("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma
    FimFormat("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, Granite code, Refact
    FimFormat("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek Coder
    FimFormat("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"),  # CodeLlama (its pieces carry SentencePiece's space)
    FimFormat("<PRE>", "<SUF>", "<MID>"),  # CodeLlama as some conversions store it
    FimFormat("[PREFIX]", "[SUFFIX]", None, suffix_first=True),  # Codestral: [SUFFIX] suffix [PREFIX] prefix
)


def fim_format(tok: Tokenizer) -> FimFormat | None:
    """The markers a GGUF file names (tokenizer.ggml.fim_pre/suf/mid_token_id, as llama.cpp reads them), else the
    family whose every marker is one entry of the model's vocabulary; else None."""
    named = _named(tok)
    if named is not None:
        return named
    for fmt in FORMATS:
        if all(tok.token_to_id(m) is not None for m in fmt.markers):
            return fmt
    return None


def _named(tok: Tokenizer) -> FimFormat | None:
    """The file's own markers, in the order of the family their texts are (Codestral's suffix first), else prefix,
    suffix, middle; None where it names none, or no middle for a family that writes one."""
    if len(tok.fim_ids) < 2:
        return None
    texts = [tok.id_to_token(i) or "" for i in tok.fim_ids]
    family = next((f for f in FORMATS if (f.prefix, f.suffix) == (texts[0], texts[1])), None)
    if family is not None and family.suffix_first:
        return FimFormat(texts[0], texts[1], None, True, tok.fim_ids[:2])
    if len(texts) < 3:
        return None
    return FimFormat(*texts, ids=tok.fim_ids)


def fim_markers(tok: Tokenizer) -> tuple[str, ...] | None:
    """The model's markers (what its info shows), or None where it was not trained to fill in the middle."""
    fmt = fim_format(tok)
    return None if fmt is None else fmt.markers


def fim_ids(tok: Tokenizer, fmt: FimFormat, prefix: str, suffix: str) -> list[int]:
    """The prompt whose continuation is the middle: BOS where the model takes one, the markers' ids, the prefix encoded
    as text that starts a stretch (SentencePiece's space before it, as Meta's and Mistral's references write it) and
    the suffix as text that goes on from the hole (no space added); marker texts typed in either are plain text."""
    marker = dict(zip(fmt.markers, fmt.ids)).get if fmt.ids else tok.token_to_id
    before = tok.backend.encode(prefix, literal=True, start=True) if prefix else []
    after = tok.backend.encode(suffix, literal=True, start=False) if suffix else []
    if fmt.suffix_first:
        ids = [marker(fmt.suffix), *after, marker(fmt.prefix), *before]
    else:
        ids = [marker(fmt.prefix), *before, marker(fmt.suffix), *after, marker(fmt.middle)]
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    return bos + ids
