"""A raw turn's prompt given as token ids (what /v1/completions takes from evaluation harnesses): rendered as the ids
themselves, no BOS added, refused where an id is outside the vocabulary or the ids outgrow the context."""
from __future__ import annotations

import pytest

from engine.errors import ContextOverflowError, ParleyError
from engine.session import TurnRequest, render_turn
from engine.tokenizer.hf_files import tokenizer_from_hf_dir

TEXT = "The capital of France is"


@pytest.fixture(scope="module")
def tok(tiny_models):
    """The tiny Llama's tokenizer: it writes a BOS before a text prompt."""
    return tokenizer_from_hf_dir(tiny_models["llama"].hf_dir)


def _render(request: TurnRequest, tok, limit: int = 256) -> list[int]:
    request.check(raw=True)
    ids, dropped = render_turn(request, raw=True, overflow="stop", tok=tok, limit=limit)
    assert dropped == 0
    return ids


def test_ids_are_the_prompt_as_given_without_a_bos(tok):
    text = _render(TurnRequest(({"role": "user", "content": TEXT},)), tok)
    assert text[0] == tok.bos_id  # a text prompt gets the model's BOS
    assert _render(TurnRequest((), prompt_ids=tuple(text)), tok) == text  # the client's BOS stays
    assert _render(TurnRequest((), prompt_ids=tuple(text[1:])), tok) == text[1:]  # none is added


def test_an_id_outside_the_vocabulary_is_refused_by_name(tok):
    with pytest.raises(ParleyError, match=f"token id {tok.vocab_size}, outside this model's vocabulary"):
        _render(TurnRequest((), prompt_ids=(1, tok.vocab_size)), tok)
    _render(TurnRequest((), prompt_ids=(tok.vocab_size - 1,)), tok)  # the last id is the vocabulary's


def test_ids_longer_than_the_context_get_the_text_prompts_refusal(tok):
    limit = 16
    with pytest.raises(ContextOverflowError) as as_text:
        _render(TurnRequest(({"role": "user", "content": "word " * 40},)), tok, limit)
    ids = tok.encode("word " * 40, add_bos=True)
    with pytest.raises(ContextOverflowError) as as_ids:
        _render(TurnRequest((), prompt_ids=tuple(ids)), tok, limit)
    assert str(as_ids.value) == str(as_text.value) and as_ids.value.code == "context_length_exceeded"


def test_an_empty_text_is_refused_where_the_model_writes_no_bos(tok, tiny_models):
    """The tiny Qwen3 has no BOS: an empty prompt rendered to no ids, and its turn never answered (the request hung)."""
    empty = TurnRequest(({"role": "user", "content": ""},))
    assert _render(empty, tok) == [tok.bos_id]  # the Llama's BOS is a prompt of one token
    with pytest.raises(ParleyError, match="The prompt is empty"):
        _render(empty, tokenizer_from_hf_dir(tiny_models["qwen3"].hf_dir))


@pytest.mark.parametrize("request_, raw, words", [
    (TurnRequest((), prompt_ids=()), True, "empty"),
    (TurnRequest((), prompt_ids=(1, -1)), True, "integers of 0 or more"),
    (TurnRequest((), prompt_ids=(1, True)), True, "integers of 0 or more"),
    (TurnRequest((), prompt_ids=(1,)), False, "plain-text completion"),
    (TurnRequest((), prompt_ids=(1,), suffix="x"), True, "no text, suffix"),
    (TurnRequest(({"role": "user", "content": "x"},), prompt_ids=(1,)), True, "no text, suffix"),
])
def test_a_token_id_turn_that_cannot_run_is_refused(request_, raw, words):
    with pytest.raises(ParleyError, match=words):
        request_.check(raw)
