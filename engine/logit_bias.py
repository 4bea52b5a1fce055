"""Logit bias: numbers a turn adds to chosen tokens' logits before they are sampled (OpenAI's `logit_bias`)."""
from __future__ import annotations

from collections.abc import Callable

import torch


def bias_rows(logits: torch.Tensor, spans: list[tuple[int, int]], biases: list[dict[int, float]],
              keep: bool) -> Callable[[], object]:
    """Adds each sampler's `biases` to its rows (`spans`: first row, row count; a verify step's sampler owns several),
    in place; returns what puts the biased entries back where `keep` (log-probabilities are the model's own), else
    nothing to undo. Ids past the logits' width are left out (a turn naming one is refused before it starts)."""
    vocab = logits.shape[-1]
    rows, tokens, values = [], [], []
    for (start, count), bias in zip(spans, biases):
        named = [(t, v) for t, v in bias.items() if t < vocab]
        for row in range(start, start + count):
            rows += [row] * len(named)
            tokens += [t for t, _ in named]
            values += [v for _, v in named]
    if not rows:
        return lambda: None
    dev = logits.device
    at = (torch.tensor(rows).to(dev, non_blocking=True), torch.tensor(tokens).to(dev, non_blocking=True))
    add = torch.tensor(values, dtype=logits.dtype).to(dev, non_blocking=True)
    with torch.inference_mode():  # the runner's logits are inference tensors: written only in that mode
        original = logits[at]
        logits.index_put_(at, original + add)

    def restore() -> None:
        if keep:
            with torch.inference_mode():
                logits.index_put_(at, original)

    return restore


def check_bias_ids(bias: dict[int, float] | None, vocab: int) -> str | None:
    """Why a turn's logit bias cannot apply to a model of `vocab` tokens (an id it does not have), or None."""
    past = sorted(t for t in bias or {} if t >= vocab)
    if not past:
        return None
    return f"logit_bias names token {past[0]}, but this model's vocabulary has {vocab:,} tokens (ids 0-{vocab - 1})."
