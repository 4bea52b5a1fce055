"""Tokenizers built from GGUF metadata and Hugging Face folders, checked against reference tokenizers."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine.errors import TokenizerError
from engine.tokenizer import Tokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir


from tests.support.gemma import (  # noqa: E402
    CHATML_TEMPLATE,
    CORPUS,
    TRAINING_TEXT,
    byte_level_metadata,
    sentencepiece_metadata,
    train_sentencepiece,
)

# -- the embedded Gemma 3 (SentencePiece-style GGUF vocabulary)


@pytest.mark.slow
def test_gemma_known_ids(gemma_tokenizer: Tokenizer) -> None:
    assert gemma_tokenizer.encode("Hello, world! How are you?") == [2, 9259, 236764, 1902, 236888, 2088, 659, 611, 236881]
    assert gemma_tokenizer.encode("The capital of France is") == [2, 818, 5279, 529, 7001, 563]
    assert gemma_tokenizer.encode("The capital of France is", add_bos=False) == [818, 5279, 529, 7001, 563]


@pytest.mark.slow
def test_gemma_special_ids(gemma_tokenizer: Tokenizer) -> None:
    tok = gemma_tokenizer
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos) == (262144, 2, 1, True)
    assert tok.stop_ids == frozenset({1, 106})
    assert tok.encode("<start_of_turn>user\n", add_bos=False)[:2] == [105, 2364]
    assert tok.token_to_id("<end_of_turn>") == 106 and tok.id_to_token(106) == "<end_of_turn>"
    assert tok.token_to_id("▁▁") == 138  # whitespace runs are stored with real spaces in the GGUF
    assert tok.decode([2, 9259, 1]) == "<bos>Hello<eos>"
    assert tok.decode([2, 9259, 1], skip_special=True) == "Hello"


@pytest.mark.slow
def test_gemma_matches_transformers(gemma_tokenizer: Tokenizer, gemma_oracle) -> None:
    for text in CORPUS:
        assert gemma_tokenizer.encode(text) == gemma_oracle(text).input_ids, repr(text)


@pytest.mark.slow
def test_gemma_round_trip(gemma_tokenizer: Tokenizer) -> None:
    for text in CORPUS:
        assert gemma_tokenizer.decode(gemma_tokenizer.encode(text, add_bos=False)) == text


@pytest.mark.slow
def test_gemma_byte_fallback(gemma_tokenizer: Tokenizer) -> None:
    ids = gemma_tokenizer.encode("\U0001F9A9\U00010348", add_bos=False)
    pieces = [gemma_tokenizer.id_to_token(i) for i in ids]
    assert all(p.startswith("<0x") for p in pieces) and len(pieces) == 8


@pytest.mark.slow
def test_gemma_builds_fast(gemma_metadata: dict) -> None:
    start = time.perf_counter()
    tokenizer_from_gguf(gemma_metadata)
    assert time.perf_counter() - start < 20  # ~2.5 s alone; generous for a shared 2-core machine


@pytest.mark.slow
def test_gemma_save_load(gemma_tokenizer: Tokenizer, tmp_path: Path) -> None:
    gemma_tokenizer.save(tmp_path)
    start = time.perf_counter()
    loaded = Tokenizer.load(tmp_path)
    assert time.perf_counter() - start < 10  # ~1 s alone
    for text in CORPUS:
        assert loaded.encode(text) == gemma_tokenizer.encode(text)
    assert loaded.stop_ids == gemma_tokenizer.stop_ids
    assert (loaded.vocab_size, loaded.bos_id, loaded.eos_id, loaded.add_bos) == (262144, 2, 1, True)
    assert loaded.chat_template.source == gemma_tokenizer.chat_template.source


@pytest.mark.slow
def test_gemma_chat_prompt_has_one_bos(gemma_tokenizer: Tokenizer) -> None:
    ids = gemma_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert ids[:3] == [2, 105, 2364] and ids.count(2) == 1
    assert ids[-3:] == [105, 4368, 107]  # <start_of_turn>model\n


# -- SentencePiece BPE vocabularies (GGUF `llama`), against sentencepiece itself


@pytest.mark.parametrize("space_prefix", [False, True])
def test_sentencepiece_vocab_matches_sentencepiece(space_prefix: bool) -> None:
    sp = train_sentencepiece(add_dummy_prefix=space_prefix)
    tok = tokenizer_from_gguf(sentencepiece_metadata(sp, space_prefix))
    for text in CORPUS + TRAINING_TEXT.split("\n"):
        if space_prefix and "_of_turn>" in text:  # llama.cpp's prefix after each special token: test_against_llama_cpp
            continue
        assert tok.encode(text, add_bos=False) == sp.encode(text), repr(text)
        assert tok.decode(tok.encode(text, add_bos=False)) == text


def test_sentencepiece_vocab_flags() -> None:
    sp = train_sentencepiece(add_dummy_prefix=False)
    tok = tokenizer_from_gguf(sentencepiece_metadata(sp, False))
    assert tok.encode("hi")[0] == 2 and tok.encode("hi", add_bos=False)[0] != 2
    assert tok.encode("") == [2] and tok.encode("", add_bos=False) == []
    assert tok.encode("<start_of_turn>", add_bos=False) == [sp.piece_to_id("<start_of_turn>")]
    assert tok.stop_ids == frozenset({1, sp.piece_to_id("<end_of_turn>")})


def test_control_typed_unknown_token_acts_as_unknown() -> None:
    metadata = sentencepiece_metadata(train_sentencepiece(add_dummy_prefix=False), False)
    metadata["tokenizer.ggml.token_type"][3] = 3  # Gemma types <unk> CONTROL
    tokens = metadata["tokenizer.ggml.tokens"]
    for i, kind in enumerate(metadata["tokenizer.ggml.token_type"]):
        if kind == 6:  # no byte fallback: characters outside the vocabulary become the unknown token
            tokens[i], metadata["tokenizer.ggml.token_type"][i] = f"<byte {i}>", 3
    tok = tokenizer_from_gguf(metadata)
    assert tok.encode("€", add_bos=False) == [3]


# -- byte-level BPE vocabularies (GGUF `gpt2`), against the trained tokenizer


@pytest.mark.parametrize("pre", ["gpt2", "default", "some-future-pre"])
def test_byte_level_gguf_matches_trained(trained_byte_level, pre: str) -> None:
    tok = tokenizer_from_gguf(byte_level_metadata(trained_byte_level, pre))
    for text in CORPUS:
        assert tok.encode(text) == trained_byte_level.encode(text).ids, repr(text)
        assert tok.decode(tok.encode(text)) == text


def test_thought_tags_typed_control_stay_in_streamed_text(trained_byte_level) -> None:
    """Magistral's vocabulary types [THINK] and [/THINK] control: a streamed answer keeps them (the app folds the
    thought between them) while other control tokens are still left out."""
    metadata = byte_level_metadata(trained_byte_level, "qwen2")
    metadata["tokenizer.ggml.tokens"] += ["[THINK]", "[/THINK]"]
    metadata["tokenizer.ggml.token_type"] += [3, 3]
    tok = tokenizer_from_gguf(metadata)
    think, end_think = tok.token_to_id("[THINK]"), tok.token_to_id("[/THINK]")
    im_start = tok.token_to_id("<|im_start|>")
    ids = [im_start, think, *tok.encode("hmm, a cat"), end_think, *tok.encode("The cat."), tok.eos_id]
    assert tok.decode(ids, skip_special=True) == "[THINK]hmm, a cat[/THINK]The cat."
    stream = tok.detokenizer()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == "[THINK]hmm, a cat[/THINK]The cat."
    assert tok.decode(ids) == "<|im_start|>[THINK]hmm, a cat[/THINK]The cat.<|im_end|>"
    assert tok.decode([im_start, *tok.encode("x")], skip_special=True) == "x"


def test_byte_level_special_tokens(trained_byte_level) -> None:
    tok = tokenizer_from_gguf(byte_level_metadata(trained_byte_level, "qwen2"))
    im_start, im_end, eot = (trained_byte_level.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    assert tok.encode("<|im_start|>user")[0] == im_start
    assert tok.stop_ids == frozenset({im_end, eot})
    assert tok.add_bos is False and tok.encode("hi")[0] != tok.bos_id
    assert tok.decode(tok.encode("a<|im_end|>"), skip_special=True) == "a"


def test_byte_level_gguf_extra_stop_ids(trained_byte_level) -> None:
    tok = tokenizer_from_gguf(byte_level_metadata(trained_byte_level, "gpt2", **{"tokenizer.ggml.eot_token_id": 42}))
    assert 42 in tok.stop_ids


# Expected pieces worked out from each regex by hand; "Ġ" is a space and "Ċ" a newline in byte-level form.
PRE_TOKENS = {
    "llama-bpe": ["I", "'m", "Ġ", "Ġfine", "!!ĊĊ", "OK", "Ġ", "123", "45"],
    "qwen2": ["I", "'m", "Ġ", "Ġfine", "!!ĊĊ", "OK", "Ġ", "1", "2", "3", "4", "5"],
    "dbrx": ["I", "'m", "Ġ", "Ġfine", "!!ĊĊ", "OK", "Ġ", "123", "45"],
    "gpt2": ["I", "'m", "Ġ", "Ġfine", "!!", "Ċ", "Ċ", "OK", "Ġ12345"],
    "smollm": ["I", "'m", "Ġ", "Ġfine", "!!", "Ċ", "Ċ", "OK", "Ġ", "1", "2", "3", "4", "5"],
    "unheard-of": ["I", "'m", "Ġ", "Ġfine", "!!", "Ċ", "Ċ", "OK", "Ġ12345"],
}


@pytest.mark.parametrize("pre", sorted(PRE_TOKENS))
def test_pre_tokenizer_by_name(trained_byte_level, pre: str) -> None:
    tok = tokenizer_from_gguf(byte_level_metadata(trained_byte_level, pre))
    pieces = [p for p, _ in tok.backend.hf.pre_tokenizer.pre_tokenize_str("I'm  fine!!\n\nOK 12345")]
    assert pieces == PRE_TOKENS[pre]


# -- Hugging Face folders


def _write_hf_dir(backend, path: Path, **files: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    for name, data in files.items():
        (path / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")
    return path


def test_hf_dir_matches_trained(trained_byte_level, tmp_path: Path) -> None:
    config = {"eos_token": {"content": "<|im_end|>"}, "bos_token": None, "chat_template": CHATML_TEMPLATE}
    eot = trained_byte_level.token_to_id("<|endoftext|>")
    path = _write_hf_dir(
        trained_byte_level, tmp_path / "hf",
        tokenizer_config=config, generation_config={"eos_token_id": [eot, 7]}, config={"vocab_size": 640},
    )
    tok = tokenizer_from_hf_dir(path)
    for text in CORPUS:
        assert tok.encode(text) == trained_byte_level.encode(text).ids
    assert tok.vocab_size == 640 and tok.bos_id is None and tok.add_bos is False
    assert tok.eos_id == trained_byte_level.token_to_id("<|im_end|>")
    assert tok.stop_ids == frozenset({tok.eos_id, eot, 7})
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert tok.decode(ids) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_hf_dir_template_file_and_bos_from_post_processor(trained_byte_level, tmp_path: Path) -> None:
    from tokenizers import processors

    eot = trained_byte_level.token_to_id("<|endoftext|>")
    backend = trained_byte_level.__class__.from_str(trained_byte_level.to_str())
    backend.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", eot)])
    path = _write_hf_dir(backend, tmp_path / "hf", tokenizer_config={"bos_token": "<|endoftext|>"})
    (path / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    tok = tokenizer_from_hf_dir(path)
    assert tok.add_bos is True and tok.encode("hi")[0] == eot
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == tok.encode("hi")  # bos once


def test_save_load_round_trip(trained_byte_level, tmp_path: Path) -> None:
    tok = tokenizer_from_gguf(byte_level_metadata(trained_byte_level, "qwen2", **{"tokenizer.chat_template": CHATML_TEMPLATE}))
    tok.save(tmp_path)
    loaded = Tokenizer.load(tmp_path)
    for text in CORPUS:
        assert loaded.encode(text) == tok.encode(text)
    assert loaded.stop_ids == tok.stop_ids and loaded.chat_template.source == CHATML_TEMPLATE
    assert (loaded.vocab_size, loaded.bos_id, loaded.eos_id, loaded.add_bos) == (tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos)


# -- errors


def test_unknown_tokenizer_model() -> None:
    with pytest.raises(TokenizerError, match="bert"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})


def test_missing_tokens() -> None:
    with pytest.raises(TokenizerError, match="tokenizer.ggml.tokens"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "llama"})


def test_missing_model_type() -> None:
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model"):
        tokenizer_from_gguf({"tokenizer.ggml.tokens": ["a", "b"]})


def test_bad_special_id(trained_byte_level) -> None:
    with pytest.raises(TokenizerError, match="eos"):
        tokenizer_from_gguf(byte_level_metadata(trained_byte_level, **{"tokenizer.ggml.eos_token_id": 10**6}))


def test_hf_dir_without_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.model").write_bytes(b"")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        tokenizer_from_hf_dir(tmp_path)


def test_load_missing_save(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError):
        Tokenizer.load(tmp_path)


QWEN3_STYLE = CHATML_TEMPLATE.replace(
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}")


@pytest.mark.parametrize("thinking, empty_thought", [(None, False), (True, False), (False, True)])
def test_the_thinking_switch_reaches_the_template(trained_byte_level, thinking, empty_thought) -> None:
    """Qwen3's template answers `enable_thinking=false` with an empty thought; unset, the template's default. The
    switch rides in the sampling params from the app, CLI and server to the rendered turn."""
    from engine.sampling import SamplingParams
    from engine.session import TurnRequest, render_turn

    tok = tokenizer_from_gguf(byte_level_metadata(trained_byte_level, "qwen2",
                                                  **{"tokenizer.chat_template": QWEN3_STYLE}))
    request = TurnRequest(({"role": "user", "content": "hi"},), SamplingParams(thinking=thinking))
    ids, _ = render_turn(request, raw=False, overflow="truncate", tok=tok, limit=4096)
    assert tok.decode(ids).endswith("assistant\n<think>\n\n</think>\n\n") == empty_thought


def test_a_template_without_a_thinking_switch_is_known(trained_byte_level) -> None:
    """`--thinking off` on a model whose template never reads the switch did nothing, without a word: the CLI says
    so from this."""
    def tok(template: str):
        return tokenizer_from_gguf(byte_level_metadata(trained_byte_level, "qwen2",
                                                       **{"tokenizer.chat_template": template}))

    assert tok(QWEN3_STYLE).thinking_switch()
    assert not tok(CHATML_TEMPLATE).thinking_switch()
