"""Per-session state on the engine thread: the conversation, its cache sequence, its sampler, the running turn."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.errors import ContextOverflowError
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence
from engine.text_stream import TextStream
from engine.tokenizer import Tokenizer

OVERFLOW_POLICIES = ("stop", "truncate")


@dataclass(eq=False, slots=True)
class Turn:
    turn_id: int
    stream: TextStream
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    dropped_messages: int = 0
    queued_position: int | None = None
    continues: str | None = None  # continuing the last answer: its text so far (the new text is appended)


@dataclass(eq=False, slots=True)
class Session:
    session_id: int
    model_id: int
    params: SamplingParams
    sampler: SamplerState
    system_prompt: str | None = None
    overflow: str = "stop"
    raw: bool = False  # a plain-text document (BOS + text), no chat template
    messages: list[dict[str, str]] = field(default_factory=list)  # user/assistant turns, no system message
    seq: Sequence | None = None  # its slot and cached tokens survive between turns
    turn: Turn | None = None
    last_used: float = field(default_factory=time.monotonic)

    def conversation(self, skip: int = 0) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + self.messages[skip:]

    def cached_ids(self) -> list[int]:
        if self.seq is None or self.seq.slot is None:
            return []
        return self.seq.token_ids[: self.seq.num_cached]


def render_turn(session: Session, tok: Tokenizer, limit: int, continue_final: bool = False) -> tuple[list[int], int]:
    """Token ids of the whole conversation plus the generation prompt, applying the overflow policy.

    `continue_final` leaves the last (assistant) message open instead, to generate more of it.
    Returns (ids, dropped) where `dropped` counts the oldest messages left out to fit `limit`.
    """
    if session.raw:
        ids = tok.encode("".join(m["content"] for m in session.messages), add_bos=True)
    else:
        ids = tok.apply_chat_template(session.conversation(), continue_final=continue_final)
    if len(ids) < limit:
        return ids, 0
    if session.overflow == "truncate" and not session.raw:
        for skip in range(1, len(session.messages)):
            if session.messages[skip]["role"] != "user":
                continue  # a conversation resumes at a user turn
            ids = tok.apply_chat_template(session.conversation(skip), continue_final=continue_final)
            if len(ids) < limit:
                return ids, skip
    raise ContextOverflowError(
        f"The conversation needs {len(ids):,} tokens but this chat's context holds {limit:,}. "
        "Start a new chat, shorten the message, or let Parley drop the oldest turns."
    )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
