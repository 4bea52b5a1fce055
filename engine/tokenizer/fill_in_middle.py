"""Fill-in-the-middle: the marker tokens a code model was trained with, found in its vocabulary, and the document
that asks it for the text between a prefix and a suffix (prefix-suffix-middle order, as llama.cpp's infill writes it)."""
from __future__ import annotations

from engine.tokenizer.tokenizer import Tokenizer

MARKERS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, Granite code, Refact
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek Coder
)


def fim_markers(tok: Tokenizer) -> tuple[str, str, str] | None:
    """The model's prefix, suffix and middle markers, where each is one token of its vocabulary; else None."""
    for markers in MARKERS:
        if all(len(tok.encode(m, add_bos=False)) == 1 for m in markers):
            return markers
    return None


def fim_document(markers: tuple[str, str, str], prefix: str, suffix: str) -> str:
    """The text whose continuation is the middle (a raw document: its markers become their tokens as it is encoded)."""
    pre, suf, mid = markers
    return f"{pre}{prefix}{suf}{suffix}{mid}"
