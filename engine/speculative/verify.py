"""Verifying drafts: which of a sequence's drafted tokens the model accepts in one step, and the token after them.

A sequence with k drafts runs k + 1 rows: its last token, then the drafts; row j's logits predict the token after
draft j - 1. Drafts are point proposals (every drafter here drafts deterministically), so the rule is:
- greedy: keep drafts while each equals its row's argmax; then that row's argmax. Exactly plain greedy's tokens.
- sampling: keep draft d at row j with probability p_j(d); at the first rejection draw from p_j with d removed
  (renormalised), else, all kept, draw from p_k. This is speculative sampling's rule with q = one-hot(d), so the
  tokens follow plain sampling's distribution exactly (p_j as plain sampling computes it: temperature, top-k/p,
  min-p). Penalties see each row's own history: the sequence's tokens and the drafts before that row.
"""
from __future__ import annotations

import torch

from engine.sampling import SamplerState, draw, penalise, probabilities


def accept(logits: torch.Tensor, states: list[SamplerState], drafts: list[list[int]],
           histories: list[list[int]]) -> list[list[int]]:
    """logits (R, V): every sampler's len(draft) + 1 rows in order -> per sampler its accepted drafts and the
    token that follows them (1 to k + 1 tokens). `histories`: each sampler's tokens so far (for penalties)."""
    counts = [len(d) + 1 for d in drafts]
    assert sum(counts) == logits.shape[0], "one row per drafted token plus one per sampler"
    row_states = [s for s, n in zip(states, counts) for _ in range(n)]
    logits = penalise(logits, row_states, [h + d[:j] for h, d in zip(histories, drafts) for j in range(len(d) + 1)])
    argmax = logits.argmax(dim=-1).tolist()
    starts = [sum(counts[:i]) for i in range(len(counts))]
    drawing = [i for i, s in enumerate(states) if not s.params.greedy]
    probs = _drawing_probabilities(logits, states, counts, starts, drawing)
    out = []
    for i, (state, draft) in enumerate(zip(states, drafts)):
        if state.params.greedy:
            out.append(_greedy(draft, argmax[starts[i] : starts[i] + counts[i]]))
        else:
            out.append(_sampled(draft, probs[i], state))
    return out


def _greedy(draft: list[int], argmax: list[int]) -> list[int]:
    a = 0
    while a < len(draft) and draft[a] == argmax[a]:
        a += 1
    return draft[:a] + [argmax[a]]


def _drawing_probabilities(logits: torch.Tensor, states: list[SamplerState], counts: list[int], starts: list[int],
                           drawing: list[int]) -> dict[int, torch.Tensor]:
    """Sampler index -> its rows' probabilities (k + 1, V), computed in one batch for every drawing sampler."""
    if not drawing:
        return {}
    rows = [r for i in drawing for r in range(starts[i], starts[i] + counts[i])]
    row_states = [states[i] for i in drawing for _ in range(counts[i])]
    probs = probabilities(logits[rows], row_states)
    out, at = {}, 0
    for i in drawing:
        out[i], at = probs[at : at + counts[i]], at + counts[i]
    return out


def _sampled(draft: list[int], probs: torch.Tensor, state: SamplerState) -> list[int]:
    k = len(draft)
    if k:
        index = torch.tensor(draft, device=probs.device)
        kept_p = probs[torch.arange(k, device=probs.device), index].tolist()
        coins = torch.rand(k, generator=state.generator, device=probs.device).tolist()
        for a in range(k):
            if coins[a] >= kept_p[a]:  # rejected: draw from what is left once the draft's own mass is gone
                rest = probs[a].clone()
                rest[draft[a]] = 0
                return draft[:a] + [int(draw(rest[None], [state])[0])]
    return draft + [int(draw(probs[k : k + 1], [state])[0])]
