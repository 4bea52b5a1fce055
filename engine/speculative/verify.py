"""Verifying drafts: which of a sequence's drafted tokens the model accepts in one step, and the token after them.

A sequence with k drafts runs k + 1 rows: its last token, then the drafts; row j's logits predict the token after
draft j - 1. Each row's token is chosen exactly as plain decoding would choose it at that position: the argmax
(greedy), or the draw from the row's probabilities with the sampler's uniform number for that position
(engine/sampling.py: the number depends on the turn's key and the position only). Drafts are kept while each equals
its row's token; the first row that differs gives the token after them. So every token equals what plain decoding
would have produced, greedy or sampled, seeded or not: verification is lossless by construction (each token is an
exact draw from its row's distribution given the tokens before it). Penalties see each row's own history: the
sequence's tokens and the drafts before that row. The attention of a verified row computes bit for bit what a
one-token step computes (engine/cache/book.py `attention_segments`), so the logits are the same too.
"""
from __future__ import annotations

from array import array

import torch

from engine.sampling import SamplerState, sample_ids


def accept(logits: torch.Tensor, states: list[SamplerState], drafts: list[list[int]],
           histories: list[list[int] | array], positions: list[int] | None = None) -> list[list[int]]:
    """logits (R, V): every sampler's len(draft) + 1 rows in order -> per sampler its accepted drafts and the
    token that follows them (1 to k + 1 tokens). `histories`: what each sampler's penalties read so far;
    `positions`: where each sampler's first row's token goes (default: after its history)."""
    counts = [len(d) + 1 for d in drafts]
    assert sum(counts) == logits.shape[0], "one row per drafted token plus one per sampler"
    row_states = [s for s, n in zip(states, counts) for _ in range(n)]
    row_histories = [array("q", h) + array("q", d[:j]) for h, d in zip(histories, drafts) for j in range(len(d) + 1)]
    starts = positions if positions is not None else [len(h) for h in histories]
    row_positions = [start + j for start, n in zip(starts, counts) for j in range(n)]
    # each row as plain decoding at its position
    tokens = sample_ids(logits, row_states, row_histories, positions=row_positions).tolist()
    out, at = [], 0
    for draft, n in zip(drafts, counts):
        out.append(_kept(draft, tokens[at : at + n]))
        at += n
    return out


def _kept(draft: list[int], chosen: list[int]) -> list[int]:
    """The drafts that equal the tokens chosen for their rows, then the chosen token of the first row that differs."""
    a = 0
    while a < len(draft) and draft[a] == chosen[a]:
        a += 1
    return draft[:a] + [chosen[a]]
