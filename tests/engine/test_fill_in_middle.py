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


def _named(ids: list[int]) -> dict:
    return {f"tokenizer.ggml.fim_{part}_token_id": i for part, i in zip(("pre", "suf", "mid"), ids)}


def test_the_markers_a_gguf_names_win_over_the_texts(sp):
    """A GGUF names its markers (tokenizer.ggml.fim_pre/suf/mid_token_id, llama.cpp's): they were not read, so a
    family the text table lacks (GLM-4's <|code_prefix|>) could not fill in, and a vocabulary holding two families'
    texts got the table's first. The ids the file names are the markers now."""
    glm = ["<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"]
    base = _tokenizer(sp, glm).vocab_size - 3
    assert fim_format(_tokenizer(sp, glm)) is None  # the texts alone: no family
    tok = _tokenizer(sp, glm, **_named([base, base + 1, base + 2]))
    fmt = fim_format(tok)
    assert fmt is not None and fmt.markers == tuple(glm)
    assert fim_ids(tok, fmt, PREFIX, SUFFIX) == [tok.bos_id, base, *sp.encode(PREFIX), base + 1, *_continuing(sp, SUFFIX),
                                                 base + 2]
    both = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    assert fim_format(_tokenizer(sp, both)).prefix == "<|fim_prefix|>"  # the table's first family
    named = fim_format(_tokenizer(sp, both, **_named([base + 3, base + 4, base + 5])))
    assert named.markers == ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")


def test_named_markers_keep_their_family_s_order_and_are_read_where_whole(sp):
    """Codestral's file names a prefix and a suffix (no middle): the suffix still goes first. A middle missing for a
    family that writes one, or an id outside the vocabulary, leaves the texts to decide."""
    tok = _tokenizer(sp, ["[PREFIX]", "[SUFFIX]"])
    pre, suf = tok.token_to_id("[PREFIX]"), tok.token_to_id("[SUFFIX]")
    fmt = fim_format(_tokenizer(sp, ["[PREFIX]", "[SUFFIX]"], **_named([pre, suf])))
    assert fmt.suffix_first and fmt.ids == (pre, suf)
    qwen = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
    base = _tokenizer(sp, qwen).vocab_size - 3
    for ids in ([base, base + 1], [base, base + 1, 10**6]):
        fmt = fim_format(_tokenizer(sp, qwen, **_named(ids)))
        assert fmt.markers == tuple(qwen) and fmt.ids == (), ids
