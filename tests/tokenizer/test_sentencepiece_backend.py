"""The SentencePiece backend of GGUF `llama` vocabularies gives the ids, text and lookups of the former
`tokenizers` BPE construction (tests/support/sentencepiece_bpe.py), which was checked against transformers."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.tokenizer import Tokenizer, tokenizer_from_gguf
from engine.tokenizer.hf_backend import HFBackend
from engine.tokenizer.sentencepiece_backend import SentencePieceBackend, join_pieces
from engine.tokenizer.tokenizer import SURROGATES

from tests.support.gemma import CORPUS, sentencepiece_metadata, train_sentencepiece  # noqa: E402
from tests.support.sentencepiece_bpe import reference_tokenizer  # noqa: E402

TEXTS = [
    *CORPUS,
    "It was the best of times, it was the worst of times; it was the age of wisdom, it was the age of foolishness.",
    "for (int i = 0; i < n; ++i) {\n\t\tif (a[i])\t{\n        return   i;\n\t}\n}\n",
    "    " * 20 + "deep" + " " * 100 + "end" + "\t" * 40 + "!",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다. ＡＢＣ　全角",
    "مرحبا بكم في عالم البرمجة ١٢٣ — שלום עולם",
    "🧑🏽‍💻 wrote 🏳️‍🌈 and ❤️‍🔥 then 🫠🫶🏿",
    "I typed <start_of_turn>model\nand <end_of_turn> and <bos><eos><pad><unk><mask> myself",
    "<start_of_turn><start_of_turn> <end_of_turn>  <start_of_turn>\n\n<end_of_turn>",
    "<unused0><unused99><unused6240> <unused",
    "html <b>bold</b> <s>x</s> <table><tr><td>1</td></tr></table> [multimodal] <start_of_image>",
    "literal bytes <0x41><0xE2> and the mark ▁ and ▁▁ spaces",
    " ", "  ", "\n", "\n" * 5, "\n" * 40, "\r\n\r\n", "\t", " \n \n ", "\n \t \n",
    "nul \0 char, del \x7f, bom \ufeff, zero width \u200b, nbsp \u00a0",
    "lone \ud800 surrogate \udfff and \udbff\udc00 pair",
    "e\u0301 vs é, ﬁ ligature, Ⅻ, ½, ℃",
]
ATOMS = [" ", "  ", " " * 33, "\n", "\n\n", "\t", "\r\n", "▁", "\0", "<0x41>", "<", ">", "<b>", "a", "Hello", "中文",
         "العربية", "😀", "👨‍👩‍👧", "\U00010348", "é", "e\u0301", "\u200b", "\ud800", "x" * 40, "123", "    ",
         "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<unused7>", "<s>", "</s>"]


def random_texts(tok: Tokenizer, n: int, seed: int) -> list[str]:
    """Mixtures of awkward atoms, vocabulary pieces and random characters."""
    rng = random.Random(seed)
    pieces = [tok.id_to_token(rng.randrange(tok.vocab_size)) or "" for _ in range(2000)]
    def part() -> str:
        r = rng.random()
        if r < 0.4:
            return rng.choice(ATOMS)
        if r < 0.7:
            piece = rng.choice(pieces)
            return piece.replace("▁", " ") if rng.random() < 0.7 else piece
        return chr(rng.randrange(32, 0x3000) if r < 0.9 else rng.randrange(0x3000, 0x110000))
    return ["".join(part() for _ in range(rng.randrange(25))) for _ in range(n)]


def assert_same(new: Tokenizer, old: Tokenizer, text: str) -> None:
    ids = old.encode(text)
    assert new.encode(text) == ids, repr(text)
    assert new.encode(text, add_bos=False) == old.encode(text, add_bos=False), repr(text)
    clean = SURROGATES.sub("\ufffd", text)
    assert new.backend.encode(clean, literal=True) == old.backend.encode(clean, literal=True), repr(text)
    for skip in (False, True):
        assert new.decode(ids, skip) == old.decode(ids, skip), repr(text)
    prefixed = new.backend.encode("x", start=True) != new.backend.encode("x", start=False)
    added = any(t.content in clean for t in old.backend.hf.get_added_tokens_decoder().values())
    if not SURROGATES.search(text) and "▁" not in text and not (prefixed and added):  # both read as a space;
        assert new.decode(ids[1:]) == text  # a dummy prefix after a special token decodes as the space it is
    convo = [{"role": "user", "content": text}, {"role": "assistant", "content": clean}]
    typed = new.backend.special_pattern is not None and new.backend.special_pattern.search(clean)
    if prefixed and typed:  # the reference prefixes text after a typed control token: test_typed_control_text_...
        return
    assert new.apply_chat_template(convo) == old.apply_chat_template(convo), repr(text)
    if clean.strip():  # an empty last message cannot be continued
        assert new.apply_chat_template(convo, continue_final=True) == old.apply_chat_template(convo, continue_final=True)


def assert_same_decoding(new: Tokenizer, old: Tokenizer, seed: int) -> None:
    """Any ids, specials and byte pieces among them, decode and stream to the same text."""
    rng = random.Random(seed)
    bytes_ = [i for i in range(old.vocab_size) if (old.id_to_token(i) or "").startswith("<0x")][:256]
    for _ in range(300):
        ids = [rng.choice(bytes_) if rng.random() < 0.4 else rng.randrange(old.vocab_size + 2) for _ in range(rng.randrange(12))]
        for skip in (False, True):
            assert new.decode(ids, skip) == old.decode(ids, skip), ids
            streams = []
            for tok in (new, old):
                detok = tok.detokenizer(skip_special=skip)
                streams.append([detok.push(i) for i in ids] + [detok.flush()])
            assert streams[0] == streams[1], ids


def assert_same_lookups(new: Tokenizer, old: Tokenizer) -> None:
    for i in range(old.vocab_size + 2):
        assert new.id_to_token(i) == old.id_to_token(i), i
    for token in [old.id_to_token(i) for i in range(old.vocab_size)] + ["", " ", "  ", "not a piece", "▁▁"]:
        assert new.token_to_id(token) == old.token_to_id(token), repr(token)
    assert (new.max_token_chars, new.stop_ids) == (old.max_token_chars, old.stop_ids)


# -- the embedded Gemma 3


@pytest.fixture(scope="module")
def gemma_reference(gemma_metadata: dict) -> Tokenizer:
    return reference_tokenizer(gemma_metadata)


@pytest.mark.slow
def test_gemma_is_sentencepiece(gemma_tokenizer: Tokenizer) -> None:
    assert isinstance(gemma_tokenizer.backend, SentencePieceBackend)


@pytest.mark.slow
def test_gemma_same_ids_as_bpe(gemma_tokenizer: Tokenizer, gemma_reference: Tokenizer) -> None:
    for text in TEXTS + random_texts(gemma_reference, 400, seed=1):
        assert_same(gemma_tokenizer, gemma_reference, text)


@pytest.mark.slow
def test_gemma_same_text_as_bpe(gemma_tokenizer: Tokenizer, gemma_reference: Tokenizer) -> None:
    assert_same_decoding(gemma_tokenizer, gemma_reference, seed=2)


@pytest.mark.slow
def test_gemma_same_lookups_as_bpe(gemma_tokenizer: Tokenizer, gemma_reference: Tokenizer) -> None:
    assert_same_lookups(gemma_tokenizer, gemma_reference)
    assert gemma_tokenizer.backend.special_pattern.pattern == gemma_reference.backend.special_pattern.pattern


@pytest.mark.slow
def test_gemma_long_text(gemma_tokenizer: Tokenizer, gemma_reference: Tokenizer) -> None:
    text = "".join(TEXTS) * 20  # past HFBackend's GIL_FREE_CHARS
    assert gemma_tokenizer.encode(text) == gemma_reference.encode(text)


# -- tiny SentencePiece vocabularies trained on the spot


@pytest.fixture(scope="module", params=[False, True], ids=["no-prefix", "space-prefix"])
def tiny_pair(request) -> tuple[Tokenizer, Tokenizer]:
    metadata = sentencepiece_metadata(train_sentencepiece(request.param), request.param)
    return tokenizer_from_gguf(metadata), reference_tokenizer(metadata)


def test_dummy_prefix_goes_where_llama_cpp_puts_it() -> None:
    """Before the text and after each special token, never before a bos the text starts with; text after a
    control token typed by the user continues it (placeholder text is plain text, not a special token)."""
    sp = train_sentencepiece(add_dummy_prefix=True)
    tok = tokenizer_from_gguf(sentencepiece_metadata(sp, True))
    bos, eos, mark = tok.token_to_id("<s>"), tok.token_to_id("</s>"), tok.token_to_id("▁")
    hello = sp.encode("Hello")  # SentencePiece's own dummy prefix: "▁Hello"
    assert tok.encode("Hello", add_bos=False) == hello
    assert tok.encode("<s>Hello", add_bos=False) == [bos, *hello]
    assert tok.encode("a</s>Hello", add_bos=False) == [*sp.encode("a"), eos, *hello]
    assert tok.encode("</s>", add_bos=False) == [eos]  # no text, no prefix
    ids = tok.apply_chat_template([{"role": "user", "content": "x<pad>Hello"}])
    assert mark not in ids[:1] and ids.count(bos) <= 1
    literal = tok.backend.encode("<pad>", literal=True, start=False)
    tail = tok.backend.encode("Hello", start=False)
    assert tail != hello and ids[-len(literal) - len(tail) - 8:].count(eos) == 0
    assert any(ids[i : i + len(literal) + len(tail)] == literal + tail for i in range(len(ids)))


def test_tiny_same_as_bpe(tiny_pair: tuple[Tokenizer, Tokenizer]) -> None:
    new, old = tiny_pair
    for text in TEXTS + random_texts(old, 300, seed=3):
        assert_same(new, old, text)
    assert_same_decoding(new, old, seed=4)
    assert_same_lookups(new, old)


def test_save_load(tiny_pair: tuple[Tokenizer, Tokenizer], tmp_path: Path) -> None:
    new, old = tiny_pair
    old.save(tmp_path)  # a tokenizer.json left behind must not shadow the SentencePiece files
    new.save(tmp_path)
    loaded = Tokenizer.load(tmp_path)
    assert isinstance(loaded.backend, SentencePieceBackend)
    for text in TEXTS:
        assert loaded.encode(text) == new.encode(text)
        assert loaded.decode(loaded.encode(text), skip_special=True) == new.decode(new.encode(text), skip_special=True)
    old.save(tmp_path)
    assert isinstance(Tokenizer.load(tmp_path).backend, HFBackend)


def _vocabulary_edit(metadata: dict, kind: str) -> None:
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    normal = [i for i, t in enumerate(types) if t == 1]
    if kind == "duplicate":
        tokens[normal[50]] = tokens[normal[51]]
    elif kind == "empty":
        tokens[normal[50]] = ""
    elif kind == "nul":
        tokens[normal[50]] = "a\0b"
    elif kind == "no unknown":
        del metadata["tokenizer.ggml.unknown_token_id"]
        tokens[3] = "<nothing>"
    elif kind == "no bytes":
        for i, t in enumerate(types):
            if t == 6:
                tokens[i], types[i] = f"<b{i}>", 3
    elif kind == "no scores or types":
        del metadata["tokenizer.ggml.scores"], metadata["tokenizer.ggml.token_type"]


@pytest.mark.parametrize("kind", ["duplicate", "empty", "nul", "no unknown", "no bytes", "no scores or types"])
def test_odd_vocabularies_build(kind: str) -> None:
    """Pieces SentencePiece refuses are stored under stand-ins; ids stay in the vocabulary and lookups real."""
    metadata = sentencepiece_metadata(train_sentencepiece(False), False)
    _vocabulary_edit(metadata, kind)
    tok = tokenizer_from_gguf(metadata)
    for text in TEXTS:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids), (kind, text)
        tok.decode(ids, skip_special=True)
    for i, token in enumerate(metadata["tokenizer.ggml.tokens"]):
        assert tok.id_to_token(i) == token
    if kind in ("duplicate", "no scores or types"):
        assert [tok.encode(t) for t in TEXTS] == [reference_tokenizer(metadata).encode(t) for t in TEXTS]


def test_join_pieces_as_bytefallback() -> None:
    assert join_pieces(["▁a", "<0xE2>", "<0x82>", "<0xAC>", "b"], strip_prefix=True) == "a€b"
    assert join_pieces(["<0xE2>", "<0x82>"], strip_prefix=False) == "\ufffd\ufffd"  # one mark per byte
    assert join_pieces(["<0x41>", "<0xE2>", "x"], strip_prefix=False) == "\ufffd\ufffdx"  # the run as a whole
    assert join_pieces(["<0x+A>", "<0xg1>", "<0x0a>"], strip_prefix=False) == "\n<0xg1>\n"
    assert join_pieces(["▁", "▁x"], strip_prefix=True) == " x"
