"""Fill-in-the-middle prompts built as ids from each family's markers (engine/tokenizer/fill_in_middle.py), and the
tokens where a filled-in middle ends."""
from __future__ import annotations

import pytest

from engine.errors import ParleyError
from engine.session import TurnRequest, render_turn
from engine.tokenizer.fill_in_middle import fim_format, fim_ids
from engine.tokenizer.from_gguf import tokenizer_from_gguf
from tests.support.gemma import sentencepiece_metadata, train_sentencepiece

PREFIX, SUFFIX = "def area(r):\n    return ", "\n\nprint(area(2))"


@pytest.fixture(scope="module")
def sp():
    return train_sentencepiece(add_dummy_prefix=True)


def _tokenizer(sp, controls: list[str], **extra):
    """A SentencePiece `llama` vocabulary (dummy prefix on) with `controls` appended as control tokens."""
    meta = sentencepiece_metadata(sp, add_space_prefix=True) | extra
    for text in controls:
        meta["tokenizer.ggml.tokens"].append(text)
        meta["tokenizer.ggml.scores"].append(0.0)
        meta["tokenizer.ggml.token_type"].append(3)
    return tokenizer_from_gguf(meta)


def _continuing(sp, text: str) -> list[int]:
    """`text` encoded as going on from text before it: Meta's and Mistral's references encode "☺" + text and drop
    the ids of "☺", so that no dummy-prefix space goes before it."""
    return sp.encode("☺" + text)[len(sp.encode("☺")):]


def test_codellama_prefix_gets_its_space_and_the_suffix_none(sp):
    """CodeLlama's markers are pieces that carry SentencePiece's space ("▁<PRE>"): a text document with "<PRE>" never
    became them, and one with "▁<SUF>" put a space before the suffix the model never saw in training."""
    tok = _tokenizer(sp, ["\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>", "\u2581<EOT>"])
    fmt = fim_format(tok)
    assert fmt is not None and fmt.middle == "\u2581<MID>"
    pre, suf, mid = (tok.token_to_id(m) for m in fmt.markers)
    assert fim_ids(tok, fmt, PREFIX, SUFFIX) == [tok.bos_id, pre, *sp.encode(PREFIX), suf, *_continuing(sp, SUFFIX), mid]
    assert tok.token_to_id("\u2581<EOT>") in tok.stop_ids  # the middle ends there


def test_codestral_puts_the_suffix_first_and_writes_no_middle_marker(sp):
    tok = _tokenizer(sp, ["[PREFIX]", "[SUFFIX]"])
    fmt = fim_format(tok)
    assert fmt is not None and fmt.suffix_first
    pre, suf = tok.token_to_id("[PREFIX]"), tok.token_to_id("[SUFFIX]")
    assert fim_ids(tok, fmt, PREFIX, SUFFIX) == [tok.bos_id, suf, *_continuing(sp, SUFFIX), pre, *sp.encode(PREFIX)]


def test_marker_text_typed_in_the_code_stays_text(sp):
    """A file that mentions the markers (a tokenizer's own source) must not open another hole."""
    tok = _tokenizer(sp, ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    fmt = fim_format(tok)
    ids = fim_ids(tok, fmt, 'MARK = "<|fim_suffix|>"\n', "<|fim_middle|> end")
    assert [ids.count(tok.token_to_id(m)) for m in fmt.markers] == [1, 1, 1]


def test_end_of_middle_tokens_stop_the_answer(sp):
    """Qwen2.5-Coder's and CodeGemma's file markers by their text, and the ids a newer GGUF names for them."""
    tok = _tokenizer(sp, ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>", "<|file_separator|>"])
    assert {tok.token_to_id("<|file_sep|>"), tok.token_to_id("<|file_separator|>")} <= tok.stop_ids
    named = _tokenizer(sp, [], **{"tokenizer.ggml.fim_sep_token_id": 600})
    assert 600 in named.stop_ids


def test_a_turn_with_a_suffix_is_built_around_the_hole_or_refused(sp):
    tok = _tokenizer(sp, ["\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"])
    request = TurnRequest(({"role": "user", "content": PREFIX},), suffix=SUFFIX)
    ids, dropped = render_turn(request, raw=True, overflow="stop", tok=tok, limit=4096)
    assert ids == fim_ids(tok, fim_format(tok), PREFIX, SUFFIX) and dropped == 0
    with pytest.raises(ParleyError, match="not trained to fill in the middle"):
        render_turn(request, raw=True, overflow="stop", tok=_tokenizer(sp, []), limit=4096)
    with pytest.raises(ParleyError, match="plain-text completion"):
        request.check(raw=False)
