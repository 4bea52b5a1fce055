"""Streaming detokenisation: pushed pieces concatenate to the full decode, never with broken characters."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from engine.tokenizer import IncrementalDetokenizer, Tokenizer, tokenizer_from_gguf


from tests.support.gemma import (  # noqa: E402
    CORPUS,
    byte_level_metadata,
    sentencepiece_metadata,
    train_sentencepiece,
)


def stream(tok: Tokenizer, ids: list[int], skip_special: bool = True) -> list[str]:
    detok = tok.detokenizer(skip_special=skip_special)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == detok.text
    return pieces


def check_stream(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    for skip in (True, False):
        pieces = stream(tok, ids, skip)
        assert "".join(pieces) == tok.decode(ids, skip_special=skip), repr(text)
        assert not any("\ufffd" in p for p in pieces), repr(text)


@pytest.fixture(scope="module", params=[False, True], ids=["no-prefix", "space-prefix"])
def sp_tokenizer(request) -> Tokenizer:
    return tokenizer_from_gguf(sentencepiece_metadata(train_sentencepiece(request.param), request.param))


@pytest.fixture(scope="module")
def bl_tokenizer(trained_byte_level) -> Tokenizer:
    return tokenizer_from_gguf(byte_level_metadata(trained_byte_level, "qwen2"))


def test_sentencepiece_corpus(sp_tokenizer: Tokenizer) -> None:
    for text in CORPUS:
        check_stream(sp_tokenizer, text)


def test_byte_level_corpus(bl_tokenizer: Tokenizer) -> None:
    for text in CORPUS:
        check_stream(bl_tokenizer, text)


def test_holds_back_split_character(sp_tokenizer: Tokenizer) -> None:
    ids = sp_tokenizer.encode("€", add_bos=False)
    # <0xE2><0x82><0xAC>: the tiny vocabulary has no euro sign
    assert [sp_tokenizer.id_to_token(i) for i in ids[-3:]] == ["<0xE2>", "<0x82>", "<0xAC>"]
    detok = sp_tokenizer.detokenizer()
    assert [detok.push(i) for i in ids][-3:] == ["", "", "€"]


def test_flush_marks_incomplete_bytes(sp_tokenizer: Tokenizer) -> None:
    detok = sp_tokenizer.detokenizer()
    pieces = [detok.push(i) for i in sp_tokenizer.encode("a€", add_bos=False)[:-1]]
    assert "".join(pieces) == "a"
    assert detok.flush().startswith("\ufffd")


def test_special_tokens_skipped_or_kept(sp_tokenizer: Tokenizer) -> None:
    ids = [sp_tokenizer.bos_id, *sp_tokenizer.encode("hi there", add_bos=False), sp_tokenizer.eos_id]
    assert "".join(stream(sp_tokenizer, ids, skip_special=True)) == "hi there"
    kept = "".join(stream(sp_tokenizer, ids, skip_special=False))
    assert kept == sp_tokenizer.decode(ids) and kept.startswith("<s>")


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40))
def test_any_text(sp_tokenizer: Tokenizer, text: str) -> None:
    ids = sp_tokenizer.encode(text)
    assert "".join(stream(sp_tokenizer, ids)) == sp_tokenizer.decode(ids, skip_special=True)


def test_works_from_any_decode_function() -> None:
    table = {0: "a", 1: "b"}
    detok = IncrementalDetokenizer(lambda ids, skip: "".join(table[i] for i in ids), skip_special=True)
    assert detok.push(0) + detok.push(1) + detok.flush() == "ab" == detok.text


@pytest.mark.slow
def test_gemma_corpus(gemma_tokenizer: Tokenizer) -> None:
    for text in CORPUS:
        check_stream(gemma_tokenizer, text)


@pytest.mark.slow
def test_gemma_emoji_one_byte_at_a_time(gemma_tokenizer: Tokenizer) -> None:
    ids = gemma_tokenizer.encode("ok \U0001F9A9\U00010348!", add_bos=False)
    pieces = stream(gemma_tokenizer, ids)
    assert "".join(pieces) == "ok \U0001F9A9\U00010348!"
    assert pieces.count("") >= 6  # each 4-byte character is held back for three of its bytes
    assert not any("\ufffd" in p for p in pieces)
