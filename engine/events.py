"""Events the engine thread sends out; every one names the session (and turn) it belongs to."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.logprobs import NamedLogprob


@dataclass(frozen=True, slots=True)
class TurnStats:
    prompt_tokens: int  # the whole rendered conversation
    prefilled_tokens: int  # what this turn actually ran through the model (the rest came from the cache)
    completion_tokens: int
    ttft_s: float | None  # submit -> first token
    tokens_per_s: float | None  # decode rate after the first token
    context_used: int
    context_limit: int
    decode_steps: int = 0  # steps that produced its tokens: fewer than the tokens when drafts were accepted
    drafted_tokens: int = 0  # speculative decoding: tokens drafted for this turn, and those the model kept
    accepted_tokens: int = 0

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens one step yielded on average, where drafting ran (engine/speculative)."""
        return self.completion_tokens / self.decode_steps if self.drafted_tokens and self.decode_steps else None


@dataclass(frozen=True, slots=True)
class Event:
    session_id: int | None


@dataclass(frozen=True, slots=True)
class TokenDelta(Event):
    turn_id: int
    token_ids: list[int]
    text: str
    # where the turn's params ask for them: each token's log-probability and its most likely alternatives, with texts
    logprobs: list[NamedLogprob] | None = None
    # on a turn's first delta, where its params ask (prompt_logprobs): each prompt token's, given those before it (the
    # first token's text, without a number)
    prompt_logprobs: list[NamedLogprob] | None = None


@dataclass(frozen=True, slots=True)
class Finished(Event):
    """The end of a turn. reason: stop, stop_string, length, cancelled, context_full, closed."""

    turn_id: int
    reason: str
    text: str
    stats: TurnStats


@dataclass(frozen=True, slots=True)
class Error(Event):
    """A failure that ends a turn (turn_id set) or a command that could not be carried out."""

    turn_id: int | None
    message: str
    code: str | None = None  # ParleyError.code: e.g. "context_length_exceeded"


@dataclass(frozen=True, slots=True)
class Queued(Event):
    """The turn waits for a cache slot; position 0 is next."""

    turn_id: int
    position: int


@dataclass(frozen=True, slots=True)
class Started(Event):
    turn_id: int


@dataclass(frozen=True, slots=True)
class ContextUsage(Event):
    used: int
    limit: int
    dropped_messages: int = 0  # oldest turns dropped by the overflow policy for this turn


@dataclass(frozen=True, slots=True)
class ModelProgress(Event):
    model_id: int
    stage: str
    fraction: float


@dataclass(frozen=True, slots=True)
class ModelLoaded(Event):
    model_id: int
    name: str
    info: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelUnloaded(Event):
    model_id: int


@dataclass(frozen=True, slots=True)
class ModelFailed(Event):
    model_id: int
    message: str
