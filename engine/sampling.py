"""SamplingParams and the per-session sampler state; sampling of a whole step is batched on the device."""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

import torch

from engine.errors import ParleyError

# Bounds every value entering from a chat file, the server or settings is checked against: beyond them a value
# cannot mean anything useful and (top_k 1e20, seed 2**70) fails the batched step of every chat sharing it.
MAX_INT32 = 2**31 - 1
MASK64 = 2**64 - 1
MAX_TEMPERATURE = 100.0
MAX_PENALTY = 100.0
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000


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
    speculative: bool = True  # draft and verify when the model has a drafter on (engine/speculative)
    # a thinking model's switch, as its chat template's `enable_thinking` (Qwen3, SmolLM3); None: the template's default
    thinking: bool | None = None

    def __post_init__(self) -> None:
        _check_types(self)
        checks = [
            (0 <= self.temperature <= MAX_TEMPERATURE, f"temperature must be between 0 and {MAX_TEMPERATURE:g}"),
            (0 <= self.top_k <= MAX_INT32, f"top_k must be between 0 and {MAX_INT32}"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p < 1, "min_p must be in [0, 1)"),
            (0 < self.repetition_penalty <= MAX_PENALTY, f"repetition_penalty must be in (0, {MAX_PENALTY:g}]"),
            (abs(self.presence_penalty) <= MAX_PENALTY, f"presence_penalty must be between ±{MAX_PENALTY:g}"),
            (abs(self.frequency_penalty) <= MAX_PENALTY, f"frequency_penalty must be between ±{MAX_PENALTY:g}"),
            (self.seed is None or 0 <= self.seed < 2**64, "seed must be between 0 and 2**64 - 1"),
            (1 <= self.max_tokens <= MAX_INT32, f"max_tokens must be between 1 and {MAX_INT32}"),
            (len(self.stop) <= MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings are allowed"),
            (all(0 < len(s) <= MAX_STOP_CHARS for s in self.stop), f"stop strings must hold 1 to {MAX_STOP_CHARS} characters"),
        ]
        for ok, message in checks:
            if not ok:
                raise ParleyError(f"Invalid sampling setting: {message}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check_types(p: SamplingParams) -> None:
    """Numbers must be real, finite numbers (ints where counts are meant); NaN and bools are refused."""
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ParleyError(f"Invalid sampling setting: {name} must be a finite number, not {value!r}.")
    for name in ("top_k", "max_tokens", "seed"):
        value = getattr(p, name)
        if not (value is None and name == "seed") and (isinstance(value, bool) or not isinstance(value, int)):
            raise ParleyError(f"Invalid sampling setting: {name} must be an integer, not {value!r}.")
    if not isinstance(p.speculative, bool):
        raise ParleyError(f"Invalid sampling setting: speculative must be true or false, not {p.speculative!r}.")
    if p.thinking is not None and not isinstance(p.thinking, bool):
        raise ParleyError(f"Invalid sampling setting: thinking must be true, false or unset, not {p.thinking!r}.")
    if not isinstance(p.stop, list) or not all(isinstance(s, str) for s in p.stop):
        raise ParleyError("Invalid sampling setting: stop must be a list of strings.")


class SamplerState:
    """One per session: its params and the random key of its turn.

    The noise that draws the token at context position p comes from (key, p) alone, never from how many draws came
    before: a token is the same whether it was drawn alone, in a batch, after a dropped look-ahead draw, or as a
    verified draft (engine/speculative/verify.py). The key is the seed when one is set (the same turn draws the same
    tokens), else fresh random bits each turn (a regenerated answer differs)."""

    def __init__(self, params: SamplingParams, device: torch.device | str = "cpu"):
        self.generator = torch.Generator(device=device)
        self.params = params
        self.key = 0
        self.begin_turn()

    def begin_turn(self) -> None:
        self.key = self.params.seed if self.params.seed is not None else secrets.randbits(64)

    def fork(self) -> "SamplerState":
        """A copy with the same key."""
        child = SamplerState(self.params, self.generator.device)
        child.key = self.key
        return child

    def update(self, params: SamplingParams) -> None:
        self.params = params

    def noise(self, position: int, like: torch.Tensor) -> torch.Tensor:
        """Exp(1) noise, shaped like `like`, for the token at `position`."""
        self.generator.manual_seed(_mix(self.key, position))
        return torch.empty_like(like).exponential_(generator=self.generator)


def _mix(key: int, position: int) -> int:
    """splitmix64 of the pair: distinct positions (and keys) give unrelated seeds."""
    z = (key + (position + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def sample_ids(logits: torch.Tensor, states: list[SamplerState], histories: list[list[int]],
               argmax: torch.Tensor | None = None, positions: list[int] | None = None) -> torch.Tensor:
    """logits (R, V) fp32, one row per sampling session -> the chosen ids (R,), on the logits' device: nothing
    waits for the GPU here. `argmax`: the logits' row argmax when the step computed it already (used unless
    penalties change the logits). `positions`: where each id goes in its context (default: after its history)."""
    penalised = penalise(logits, states, histories)
    if argmax is None or penalised is not logits:
        argmax = _argmax(penalised)
    logits = penalised
    drawing = [i for i, s in enumerate(states) if not s.params.greedy]
    if not drawing:
        return argmax
    greedy_ids = argmax.clone()  # the graph's output buffer is not ours to write
    picked = [states[i] for i in drawing]
    at = [positions[i] if positions is not None else len(histories[i]) for i in drawing]
    probs = probabilities(logits[drawing], picked)
    greedy_ids[drawing] = draw(probs, picked, at)
    return greedy_ids


def probabilities(rows: torch.Tensor, states: list[SamplerState]) -> torch.Tensor:
    """What each drawing row samples from: softmax at its temperature, then top-k, top-p and min-p."""
    temps = torch.tensor([s.params.temperature for s in states], device=rows.device)
    return _filter(torch.softmax(rows / temps[:, None], dim=-1), states)


def draw(probs: torch.Tensor, states: list[SamplerState], positions: list[int]) -> torch.Tensor:
    """One id per row of `probs` (unnormalised weights will do), with its state's noise for its position."""
    noise = torch.stack([s.noise(p, probs[0]) for s, p in zip(states, positions)])
    return _argmax(probs / noise)  # exponential race: an exact draw from `probs`


def _argmax(rows: torch.Tensor) -> torch.Tensor:
    """Each row's first index of its maximum; on the CPU the library's vector argmax where built (torch's is scalar)."""
    if rows.is_cuda:
        return rows.argmax(dim=-1)
    from kernels.argmax import argmax_rows

    return argmax_rows(rows, impl="auto")


def penalise(logits: torch.Tensor, states: list[SamplerState], histories: list[list[int]]) -> torch.Tensor:
    """Repetition, presence and frequency penalties of each row's state over its history; `logits` itself when no
    row has any (else a penalised copy)."""
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
    vocab = probs.shape[-1]
    top_k = torch.tensor([min(s.params.top_k or vocab, vocab) for s in states], device=dev)  # never past int64
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
