"""A turn's grammar as it goes (Guide), the model's grammar tokenizer (Grammars), and the mask of a step's rows."""
from __future__ import annotations

import threading
from collections.abc import Callable
from itertools import accumulate

import torch
from llguidance import LLExecutor, LLMatcher, LLTokenizer

from engine.constraint.grammar import with_control_tokens
from engine.errors import ParleyError
from engine.tokenizer.tokenizer import Tokenizer
from kernels.token_mask import BITS, refuse_tokens


class Guide:
    """One answer's place in its grammar: which tokens may come next, and the tokens taken so far."""

    def __init__(self, matcher: LLMatcher, executor: Callable[[], LLExecutor]) -> None:
        self.matcher = matcher
        self.executor = executor  # its model's: fills a step's masks on several threads
        self.error: str | None = None  # the matcher's message once a token broke the grammar

    def advance(self, token: int) -> None:
        if self.error is None and not self.matcher.consume_token(token):
            self.error = self.matcher.get_error() or "the token does not follow the grammar"

    @property
    def finished(self) -> bool:
        """Nothing may follow but a stop token (the grammar is complete), or the grammar failed."""
        return self.error is not None or self.matcher.is_stopped()


class Grammars:
    """One model's guides. Its grammar tokenizer (about 1.5 s for a 262k vocabulary) is built on first use, on the
    thread that asks (a prompt worker), never at load: most models never see a grammar."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int) -> None:
        self._tokenizer, self.n_vocab = tokenizer, n_vocab
        self._built: LLTokenizer | None = None
        self._executor: LLExecutor | None = None
        self._lock = threading.Lock()

    def guide(self, grammar: str) -> Guide:
        grammar = with_control_tokens(grammar, self._token_of)
        matcher = LLMatcher(self._grammar_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise ParleyError(f"Invalid grammar: {matcher.get_error()}")
        return Guide(matcher, self.executor)

    def executor(self) -> LLExecutor:
        """The threads a step's masks are computed on (llguidance's own pool; it lets go of the interpreter)."""
        with self._lock:
            if self._executor is None:
                self._executor = LLExecutor()
            return self._executor

    def _token_of(self, text: str) -> int | None:
        """The id of the one token whose text is `text`, or None."""
        found = self._tokenizer.token_to_id(text)
        ok = found is not None and found < self.n_vocab and self._tokenizer.decode([found]) == text
        return found if ok else None

    def _grammar_tokenizer(self) -> LLTokenizer:
        with self._lock:
            if self._built is None:
                from engine.constraint.token_bytes import grammar_tokenizer

                self._built = grammar_tokenizer(self._tokenizer, self.n_vocab)
            return self._built


def mask_rows(logits: torch.Tensor, rows: list[int], guides: list[Guide], keep: bool,
              drafts: list[list[int]] | None = None) -> Callable[[], object]:
    """Sets each of `rows` to -inf where its guide refuses the token, in place; returns what puts the rows back where
    `keep` (log-probabilities are the model's own, read after the draw), else nothing to undo. `drafts`: guide i's
    drafted tokens, whose rows follow rows[i], each masked as the grammar stands after the drafts before it (rows past
    a draft the grammar refuses allow every token: that draft is rejected, and nothing reads them).
    The masks are computed together on llguidance's threads; on a GPU they go up from pinned memory without a wait
    and apply in one launch, so the host queues the step's sampling behind them (a wait per step for the forward cost
    0.87x at one session)."""
    drafts = drafts or [[] for _ in guides]
    dev, width = logits.device, (logits.shape[-1] + BITS - 1) // BITS
    firsts = list(accumulate((len(d) + 1 for d in drafts), initial=0))
    pinned = dev.type == "cuda"  # torch's pinned blocks are reused only once their copy has run
    words = torch.full((firsts[-1], width), -1, dtype=torch.int32, pin_memory=pinned)
    executor, size = guides[0].executor(), width * words.element_size()
    drafted = [(g.matcher, k, d) for g, k, d in zip(guides, firsts, drafts) if d]  # llguidance takes no empty draft
    plain = [(g.matcher, k) for g, k, d in zip(guides, firsts, drafts) if not d]
    if drafted:
        executor.unsafe_compute_mask_ptr_with_draft_token(drafted, words.data_ptr(), size, len(words))
    if plain:
        executor.unsafe_compute_mask_ptr(plain, words.data_ptr(), size, len(words))
    flat = [r + j for r, d in zip(rows, drafts) for j in range(len(d) + 1)]
    index = torch.tensor(flat, dtype=torch.long, pin_memory=pinned).to(dev, non_blocking=True)
    with torch.inference_mode():  # the runner's logits are inference tensors: written only in that mode
        original = logits.index_select(0, index) if keep else None
    refuse_tokens(logits, index, words.to(dev, non_blocking=True))

    def restore() -> None:
        if original is not None:
            with torch.inference_mode():
                logits.index_copy_(0, index, original)

    return restore
