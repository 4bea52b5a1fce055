"""A turn's grammar as it goes (Guide), the model's grammar tokenizer (Grammars), and the mask of a step's rows."""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch
from llguidance import LLMatcher, LLTokenizer

from engine.errors import ParleyError
from engine.tokenizer.tokenizer import Tokenizer

BITS = 32  # llguidance's mask: one bit per token id, in 32-bit words


class Guide:
    """One answer's place in its grammar: which tokens may come next, and the tokens taken so far."""

    def __init__(self, matcher: LLMatcher) -> None:
        self._matcher = matcher
        self.error: str | None = None  # the matcher's message once a token broke the grammar

    def fill(self, words: torch.Tensor) -> None:
        """Writes the allowed next tokens' bits into `words` (a contiguous int32 host row)."""
        self._matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())

    def advance(self, token: int) -> None:
        if self.error is None and not self._matcher.consume_token(token):
            self.error = self._matcher.get_error() or "the token does not follow the grammar"

    @property
    def finished(self) -> bool:
        """Nothing may follow but a stop token (the grammar is complete), or the grammar failed."""
        return self.error is not None or self._matcher.is_stopped()


class Grammars:
    """One model's guides. Its grammar tokenizer (about 1.5 s for a 262k vocabulary) is built on first use, on the
    thread that asks (a prompt worker), never at load: most models never see a grammar."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int) -> None:
        self._tokenizer, self.n_vocab = tokenizer, n_vocab
        self._built: LLTokenizer | None = None
        self._lock = threading.Lock()

    def guide(self, grammar: str) -> Guide:
        matcher = LLMatcher(self._grammar_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise ParleyError(f"Invalid grammar: {matcher.get_error()}")
        return Guide(matcher)

    def _grammar_tokenizer(self) -> LLTokenizer:
        with self._lock:
            if self._built is None:
                from engine.constraint.token_bytes import grammar_tokenizer

                self._built = grammar_tokenizer(self._tokenizer, self.n_vocab)
            return self._built


def mask_rows(logits: torch.Tensor, rows: list[int], guides: list[Guide], keep: bool) -> Callable[[], object]:
    """Sets each of `rows` to -inf where its guide refuses the token, in place; returns what puts the rows back where
    `keep` (log-probabilities are the model's own, read after the draw), else nothing to undo."""
    vocab = logits.shape[-1]
    words = torch.zeros((len(rows), (vocab + BITS - 1) // BITS), dtype=torch.int32)
    for row, guide in zip(words, guides):
        guide.fill(row)
    dev = logits.device
    refused = _unpacked(~words, vocab, dev)
    index = torch.tensor(rows, dtype=torch.long).to(dev)
    with torch.inference_mode():  # the runner's logits are inference tensors: written only in that mode
        original = logits.index_select(0, index) if keep else None
        for j, r in enumerate(rows):  # in place, a row at a time: a masked copy of (R, V) cost 3x as much
            logits[r].masked_fill_(refused[j], float("-inf"))

    def restore() -> None:
        if original is not None:
            with torch.inference_mode():
                logits.index_copy_(0, index, original)

    return restore


def _unpacked(words: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    """(R, W) int32 words -> (R, vocab) bools on `device`: bit b of word w is token 32 w + b (little-endian hosts)."""
    if device.type == "cpu":  # numpy's unpackbits: 0.03 ms a 262k row, where torch's shifts took 0.5
        bits = np.unpackbits(words.numpy().view(np.uint8), axis=1, count=vocab, bitorder="little")
        return torch.from_numpy(bits).view(torch.bool)
    shifts = torch.arange(BITS, dtype=torch.int32, device=device)  # the device unpacks: 32 KB a row copied up
    return ((words.to(device)[:, :, None] >> shifts) & 1).view(len(words), -1)[:, :vocab].bool()
