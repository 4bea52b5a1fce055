"""What the app tracks per chat while it talks to the engine: its session and the running turn."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from app.core.conversations import Message
from app.core.reasoning import reply_text


@dataclass(slots=True)
class TurnInfo:
    turn_id: int | None  # None while waiting for the model to load
    message_id: int  # the assistant message being written
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    tokens: int = 0
    previous_state: str | None = None  # continuing an answer: the state it goes back to if the turn fails
    seed: int | None = None  # the seed this turn samples with (kept with the answer, to repeat it)
    user_id: int | None = None  # the user message this turn sends (None: a regenerate or a continuation)
    leaf_before: int | None = None  # the branch shown before it was sent, shown again if the engine refuses it
    edit_of: int | None = None  # the earlier message it is a new version of (an edit)


@dataclass(slots=True)
class Refusal:
    """A message the engine refused before answering (too long for the context, say): back with the user."""

    reason: str  # the engine's own sentence: what it needs and what fits
    edit_of: int | None = None  # an edit's message: the text goes back into that edit, not into the draft


@dataclass(slots=True)
class ChatStatus:
    """The per-chat status line: model, speed, time to first token, context meter."""

    model: str = ""
    tokens_per_s: float | None = None
    ttft_s: float | None = None
    context_used: int = 0
    context_limit: int = 0
    dropped_messages: int = 0
    prompt_tokens: int = 0  # the last turn's whole prompt
    prefilled_tokens: int = 0  # of which the model computed this many (the rest came from the prefix cache)
    tokens_per_step: float | None = None  # speculative decoding: tokens one step yielded (None: no drafting)
    state: str = "idle"  # idle, loading, queued, prefilling (reading the prompt), streaming
    since: float | None = None  # perf_counter when `state` began: the status line counts the seconds


@dataclass(slots=True)
class LiveChat:
    conv_id: int
    session_id: int | None = None
    model_key: str = ""
    model_id: int | None = None  # the engine model its session runs on (a reload gives a new id)
    overflow: str = ""
    turn: TurnInfo | None = None
    pending: Callable[[], None] | None = None  # a turn waiting for its model to load
    status: ChatStatus = field(default_factory=ChatStatus)
    context_base: int = 0  # prompt tokens of the running turn, for the live context meter
    queued: list[str] = field(default_factory=list)  # messages sent while it answered: they go next, in order
    edit_after_stop: tuple[int, str] | None = None  # an earlier message edited while it answered: goes once stopped
    refused: Refusal | None = None  # the last message the engine refused, until the next turn or a dismissal
    too_long: tuple[int, str] | None = None  # a compare column's prompt refused for its length: (message, why)

    @property
    def busy(self) -> bool:
        return self.turn is not None

    def live_rate(self) -> float | None:
        t = self.turn
        if t is None or t.first_token_at is None or t.tokens < 2:
            return None
        elapsed = time.perf_counter() - t.first_token_at
        return (t.tokens - 1) / elapsed if elapsed > 0 else None


def can_continue(msg: Message) -> bool:
    """An answer with text that ended early: stopped, interrupted, or cut short by max tokens."""
    if msg.role != "assistant" or not msg.content:
        return False
    return msg.state in ("stopped", "interrupted") or (msg.state == "done" and (msg.stats or {}).get("reason") == "length")


def engine_messages(path: list[Message], continuing: bool = False) -> list[dict[str, str]]:
    """The conversation a turn hands the engine: `engine_view`'s messages, earlier answers without their thought (a
    reasoning model reads its past replies, not its past thinking: Qwen3's and DeepSeek-R1's own templates drop it,
    Magistral's do not); the answer being continued (`continuing`) keeps all of its text."""
    view = engine_view(path)
    last = len(view) - 1 if continuing else -1
    return [{"role": m.role, "content": reply_text(m.content) if m.role == "assistant" and i != last else m.content}
            for i, m in enumerate(view)]


def engine_view(path: list[Message]) -> list[Message]:
    """The messages a turn hands the engine for a branch: failed answers and stopped ones with no text are left out."""
    return [m for m in path if not (m.role == "assistant" and (m.state == "error" or (m.state in ("stopped", "interrupted") and not m.content)))]

