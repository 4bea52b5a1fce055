"""Building a Tokenizer from GGUF metadata."""
from __future__ import annotations

from typing import Any

from engine.errors import TokenizerError
from engine.tokenizer.backend import TokenizerBackend
from engine.tokenizer.byte_level_bpe import build_byte_level_bpe
from engine.tokenizer.chat_template import GEMMA_TEMPLATE, PLAIN_TEMPLATE
from engine.tokenizer.gguf_vocab import GGUFVocab, TokenType, vocab_from_metadata
from engine.tokenizer.hf_backend import HFBackend
from engine.tokenizer.sentencepiece_model import build_sentencepiece
from engine.tokenizer.stop_tokens import collect_stop_ids
from engine.tokenizer.tokenizer import Tokenizer, TokenizerInfo

# Gemma GGUFs usually carry no template, and all Gemma generations share the turn format.
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")


def tokenizer_from_gguf(metadata: dict[str, Any]) -> Tokenizer:
    """Builds the tokenizer described by a GGUF file's metadata (as `open_gguf(path).metadata`)."""
    vocab = vocab_from_metadata(metadata)
    if vocab.model == "llama":
        vocab.unk_id = _unknown_id(vocab)
        backend: TokenizerBackend = build_sentencepiece(vocab)
    elif vocab.model == "gpt2":
        backend = HFBackend(build_byte_level_bpe(vocab))
    elif not vocab.model:
        raise TokenizerError("The model file does not say which tokenizer it uses (tokenizer.ggml.model is missing).")
    else:
        raise TokenizerError(f"Unsupported tokenizer type {vocab.model!r}; Parley reads 'llama' and 'gpt2' tokenizers.")
    return Tokenizer(backend, gguf_tokenizer_info(vocab, metadata, backend))


def gguf_tokenizer_info(vocab: GGUFVocab, metadata: dict[str, Any], backend: TokenizerBackend) -> TokenizerInfo:
    """Special ids, flags and chat template of a GGUF vocabulary, whichever backend encodes it."""
    return TokenizerInfo(
        vocab_size=len(vocab.tokens),
        bos_id=vocab.bos_id,
        eos_id=vocab.eos_id,
        add_bos=vocab.add_bos and vocab.bos_id is not None,
        stop_ids=collect_stop_ids(backend.token_to_id, vocab.eos_id, vocab.extra_stop_ids, len(vocab.tokens)),
        chat_template=gguf_template_source(metadata),
        bos_token=_token_text(vocab, vocab.bos_id),
        eos_token=_token_text(vocab, vocab.eos_id),
        fim_ids=_fim_ids(vocab),
    )


def _fim_ids(vocab: GGUFVocab) -> tuple[int, ...]:
    """The fill-in-the-middle markers the file names (prefix, suffix and middle, or the first two): () without both
    of the first two."""
    pre, suf, mid = vocab.fim_ids
    if pre is None or suf is None:
        return ()
    return (pre, suf) if mid is None else (pre, suf, mid)


def _unknown_id(vocab: GGUFVocab) -> int | None:
    # Gemma types <unk> as CONTROL, so the declared id comes first, then the type, then the name.
    if vocab.unk_id is not None:
        return vocab.unk_id
    for i, kind in enumerate(vocab.types):
        if kind == TokenType.UNKNOWN:
            return i
    return vocab.tokens.index("<unk>") if "<unk>" in vocab.tokens else None


def gguf_template_source(metadata: dict[str, Any]) -> str:
    source = metadata.get("tokenizer.chat_template")
    if isinstance(source, str) and source.strip():
        return source
    if metadata.get("general.architecture") in GEMMA_ARCHITECTURES:
        return GEMMA_TEMPLATE
    return PLAIN_TEMPLATE


def _token_text(vocab: GGUFVocab, token_id: int | None) -> str:
    return vocab.tokens[token_id] if token_id is not None else ""
