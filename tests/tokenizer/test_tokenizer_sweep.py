"""Held-out cases for tokenizers, streaming text and stop strings: long runs, typed control text, stops."""
from __future__ import annotations

import pytest

from engine.tokenizer import IncrementalDetokenizer, Tokenizer, tokenizer_from_gguf
from tests.support.gemma import sentencepiece_metadata, train_sentencepiece


@pytest.fixture(scope="module", params=[False, True], ids=["no-prefix", "space-prefix"])
def sp_tokenizer(request) -> Tokenizer:
    return tokenizer_from_gguf(sentencepiece_metadata(train_sentencepiece(request.param), request.param))


@pytest.mark.parametrize("run", ["<s>", "<0x80>"])
def test_a_long_run_without_text_streams_in_linear_time(sp_tokenizer: Tokenizer, run: str) -> None:
    """A model stuck on a skipped control token or an invalid byte: each push decodes a short window, not all the
    ids since the last character (which made 20k such tokens take minutes on the engine thread)."""
    decoded = [0]

    def decode(ids: list[int], skip: bool) -> str:
        decoded[0] += len(ids)
        return sp_tokenizer.decode(ids, skip)

    ids = [*sp_tokenizer.encode("hi", add_bos=False), *[sp_tokenizer.token_to_id(run)] * 3000,
           *sp_tokenizer.encode(" there €", add_bos=False)]
    detok = IncrementalDetokenizer(decode, skip_special=True)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == sp_tokenizer.decode(ids, skip_special=True)
    assert decoded[0] < 100 * len(ids)
