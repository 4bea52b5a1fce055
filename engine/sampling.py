"""SamplingParams and the per-session sampler state; sampling of a whole step is batched on the device."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.errors import ParleyError


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        checks = [
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.top_k >= 0, "top_k must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p < 1, "min_p must be in [0, 1)"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (self.max_tokens >= 1, "max_tokens must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ParleyError(f"Invalid sampling setting: {message}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class SamplerState:
    """One per session: its params and a random generator that continues across turns."""

    def __init__(self, params: SamplingParams, device: torch.device | str = "cpu"):
        self.generator = torch.Generator(device=device)
        self.params = params
        self.generator.manual_seed(params.seed if params.seed is not None else torch.seed())

    def fork(self) -> "SamplerState":
        """A copy whose generator continues from the same state."""
        child = SamplerState(self.params, self.generator.device)
        child.generator.set_state(self.generator.get_state())
        return child

    def update(self, params: SamplingParams) -> None:
        if params.seed is not None and params.seed != self.params.seed:
            self.generator.manual_seed(params.seed)
        self.params = params


def sample_ids(logits: torch.Tensor, states: list[SamplerState], histories: list[list[int]],
               argmax: torch.Tensor | None = None) -> torch.Tensor:
    """logits (R, V) fp32, one row per sampling session -> the chosen ids (R,), on the logits' device: nothing
    waits for the GPU here. `argmax`: the logits' row argmax when the step computed it already (used unless
    penalties change the logits)."""
    penalised = _apply_penalties(logits, states, histories)
    if argmax is None or penalised is not logits:
        argmax = penalised.argmax(dim=-1)
    logits = penalised
    drawing = [i for i, s in enumerate(states) if not s.params.greedy]
    if not drawing:
        return argmax
    greedy_ids = argmax.clone()  # the graph's output buffer is not ours to write
    picked = [states[i] for i in drawing]
    rows = logits[drawing]
    temps = torch.tensor([s.params.temperature for s in picked], device=logits.device)
    probs = _filter(torch.softmax(rows / temps[:, None], dim=-1), picked)
    noise = torch.stack([torch.empty_like(probs[0]).exponential_(generator=s.generator) for s in picked])
    drawn = (probs / noise).argmax(dim=-1)  # exponential race: an exact draw from `probs`
    greedy_ids[drawing] = drawn
    return greedy_ids


def _apply_penalties(logits: torch.Tensor, states: list[SamplerState], histories: list[list[int]]) -> torch.Tensor:
    rows = [i for i, s in enumerate(states) if penalised(s.params) and histories[i]]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        p = states[i].params
        ids, counts = torch.tensor(histories[i], device=logits.device).unique(return_counts=True)
        row = logits[i]
        seen = row[ids]
        if p.repetition_penalty != 1.0:
            seen = torch.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
        seen = seen - p.presence_penalty - p.frequency_penalty * counts.to(seen.dtype)
        row[ids] = seen
    return logits


def penalised(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _filter(probs: torch.Tensor, states: list[SamplerState]) -> torch.Tensor:
    """top-k, top-p and min-p as one masked renormalisation per row."""
    if all(s.params.top_k == 0 and s.params.top_p >= 1 and s.params.min_p == 0 for s in states):
        return probs
    dev = probs.device
    top_k = torch.tensor([s.params.top_k or probs.shape[-1] for s in states], device=dev)
    top_p = torch.tensor([s.params.top_p for s in states], device=dev)
    min_p = torch.tensor([s.params.min_p for s in states], device=dev)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=dev)[None, :]
    keep = rank < top_k[:, None]
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above this token
    keep &= before < top_p[:, None]
    keep &= sorted_p >= min_p[:, None] * sorted_p[:, :1]
    keep[:, 0] = True
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return filtered / filtered.sum(dim=-1, keepdim=True)
