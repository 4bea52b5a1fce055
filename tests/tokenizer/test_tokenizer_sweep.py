"""Held-out cases for tokenizers, streaming text and stop strings: long runs, typed control text, stops."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.tokenizer import IncrementalDetokenizer, Tokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir
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


MISTRAL_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")


def _llama2_hf_dir(path: Path, pre_tokenizer: dict | None = None) -> Path:
    """A Llama 2 / Mistral style tokenizer.json (SentencePiece pieces, a dummy "▁" prefix) in a model folder; with
    `pre_tokenizer`, a Metaspace one places the prefix instead of the Prepend normalizer."""
    from engine.tokenizer.from_gguf import _unknown_id
    from engine.tokenizer.gguf_vocab import vocab_from_metadata
    from tests.support.sentencepiece_bpe import build_sentencepiece_bpe

    vocab = vocab_from_metadata(sentencepiece_metadata(train_sentencepiece(True), True))
    vocab.unk_id = _unknown_id(vocab)
    data = json.loads(build_sentencepiece_bpe(vocab).to_str())
    if pre_tokenizer is not None:
        data["normalizer"], data["pre_tokenizer"] = None, pre_tokenizer
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "chat_template": MISTRAL_TEMPLATE}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def test_typed_control_text_gets_no_extra_spaces_in_a_prefixing_hf_tokenizer(tmp_path: Path) -> None:
    """HTML's <s>strikethrough</s> typed to a Llama 2 style tokenizer.json: the text reads as plain text, as the
    tokenizer itself reads it with special tokens off, not with a dummy "▁" before and after each typed tag."""
    from tokenizers import Tokenizer as HFTokenizer

    path = _llama2_hf_dir(tmp_path / "llama2")
    tok = tokenizer_from_hf_dir(path)
    messages = [{"role": "user", "content": "see <s>struck</s> here"}]
    text = tok.chat_template.render(messages, add_generation_prompt=True)
    plain = HFTokenizer.from_file(str(path / "tokenizer.json"))
    plain.encode_special_tokens = True
    assert text.startswith("<s>[INST]")
    assert tok.apply_chat_template(messages) == [tok.bos_id, *plain.encode(text[3:], add_special_tokens=False).ids]


def test_typed_control_text_in_a_metaspace_first_tokenizer_decodes_as_typed(tmp_path: Path) -> None:
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    tok = tokenizer_from_hf_dir(_llama2_hf_dir(tmp_path / "mistral", metaspace))
    messages = [{"role": "user", "content": "a <s> b</s>c"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "<unk> again"}]
    ids = tok.apply_chat_template(messages)
    assert tok.decode(ids) == tok.chat_template.render(messages, add_generation_prompt=True)
    assert ids.count(tok.bos_id) == 1


def test_typed_control_text_keeps_lstrip_tokens_absorbing_their_space(trained_byte_level) -> None:
    """A byte-level tokenizer (no dummy prefix) with an lstrip added token: the text after a typed control tag still
    reads in one pass, the space before the token absorbed into it as the tokenizer itself does."""
    from tokenizers import AddedToken, Tokenizer as HFTokenizer

    from engine.tokenizer.hf_backend import HFBackend
    from engine.tokenizer.tokenizer import TokenizerInfo
    from tests.support.gemma import CHATML_TEMPLATE

    hf = HFTokenizer.from_str(trained_byte_level.to_str())
    hf.add_tokens([AddedToken("<tool>", lstrip=True, special=False, normalized=False)])
    info = TokenizerInfo(vocab_size=hf.get_vocab_size(), bos_id=None, eos_id=hf.token_to_id("<|im_end|>"),
                         add_bos=False, stop_ids=frozenset(), chat_template=CHATML_TEMPLATE)
    tok = Tokenizer(HFBackend(hf), info)
    content = "a <|im_start|> b <tool> c"
    plain = HFTokenizer.from_str(hf.to_str())
    plain.encode_special_tokens = True
    messages = [{"role": "user", "content": content}]
    opening, user_turn = "<|im_start|>", tok.chat_template.render(messages, add_generation_prompt=True)
    turn, end, rest = user_turn.removeprefix(opening).partition("<|im_end|>")
    expected = [hf.token_to_id(opening), *plain.encode(turn, add_special_tokens=False).ids,
                *hf.encode(end + rest, add_special_tokens=False).ids]
    assert tok.apply_chat_template(messages) == expected


def test_a_long_answer_gathers_its_text_in_linear_time() -> None:
    """A 100-character token 30,000 times (3 MB of text): the detokenizer and the stream keep their text as pieces,
    where `text += piece` copied all the text so far on every token (tens of seconds; under one here)."""
    import time

    from engine.text_stream import TextStream

    tokens = ["<unk>", "<s>", "</s>", "a", "a" * 100]
    tok = tokenizer_from_gguf({"general.architecture": "llama", "tokenizer.ggml.model": "llama",
                               "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [2, 3, 3, 1, 1],
                               "tokenizer.ggml.scores": [0.0] * 5, "tokenizer.ggml.bos_token_id": 1,
                               "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_space_prefix": False})
    stream = TextStream(tok, ["stop"])
    started = time.perf_counter()
    for _ in range(30_000):
        stream.push(4)
    stream.finish()
    elapsed = time.perf_counter() - started
    assert stream.text == stream.detok.text == "a" * 3_000_000
    assert elapsed < 8
