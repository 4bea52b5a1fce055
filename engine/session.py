"""Per-session state on the engine thread: its cache sequence, its sampler, the running turn.

The conversation itself belongs to the caller: every turn carries the messages it continues (a
TurnRequest), and the engine reuses whatever prefix of their tokens the session's cache still holds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.errors import ContextOverflowError, ParleyError
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence
from engine.text_stream import TextStream
from engine.tokenizer import Tokenizer
from engine.tokenizer.fill_in_middle import fim_format, fim_ids

OVERFLOW_POLICIES = ("stop", "truncate")
ANSWER_ROOM_SHARE = 4  # `truncate` keeps room for the answer: its max_tokens, at most a quarter of the context
ROLES = ("user", "assistant", "tool")  # a tool message: what a call the answer made returned (OpenAI's)
ANSWERED = ("user", "tool")  # the roles a turn answers: the user's message, or a tool's result


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """What a turn answers: the conversation so far (user/assistant/tool messages, no system message), ending with
    the user message (or a tool's result) to answer, or with `continue_final` the assistant answer to generate more of.
    `tools`: OpenAI's tool objects the chat template shows the model (engine/tool_calls.py reads its calls back)."""

    messages: tuple[dict[str, str], ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    system_prompt: str | None = None
    continue_final: bool = False
    tools: tuple[dict, ...] | None = None
    suffix: str | None = None  # a raw turn's text after the insertion point: the model fills in the middle
    prompt_ids: tuple[int, ...] | None = None  # a raw turn's whole prompt as token ids, given as they are (no BOS added)
    group: int | None = None  # turns one client sent together (`Sequence.group`)

    def check(self, raw: bool) -> None:
        """Raises ParleyError when the request cannot be answered as it stands."""
        if self.prompt_ids is not None:
            self._check_ids(raw)
            return
        if not self.messages:
            raise ParleyError("There is no answer to continue." if self.continue_final else "There is no message to answer.")
        for m in self.messages:
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise ParleyError("Chat messages must be user, assistant or tool messages with text content.")
        last = self.messages[-1]
        if self.continue_final and (last["role"] != "assistant" or not last["content"]):
            raise ParleyError("There is no answer to continue.")
        if not self.continue_final and last["role"] not in ANSWERED and not raw:
            raise ParleyError("The last message must be the user's (or a tool's result) for the model to answer it.")
        if self.suffix is not None and not raw:
            raise ParleyError("Filling in the middle takes a plain-text completion, not a chat.")

    def _check_ids(self, raw: bool) -> None:
        if not raw:
            raise ParleyError("A token-id prompt takes a plain-text completion, not a chat.")
        if self.messages or self.suffix is not None or self.continue_final:
            raise ParleyError("A token-id prompt is the whole document: it takes no text, suffix or answer beside it.")
        if not self.prompt_ids:
            raise ParleyError("The token-id prompt is empty: a prompt needs one token at least.")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.prompt_ids):
            raise ParleyError("A token-id prompt holds token ids: integers of 0 or more.")

    @property
    def document(self) -> str:
        """A raw turn's text: its messages' contents as one plain-text document."""
        return "".join(m["content"] for m in self.messages)

    def conversation(self, skip: int = 0) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [dict(m) for m in self.messages[skip:]]


@dataclass(eq=False, slots=True)
class Turn:
    turn_id: int
    stream: TextStream | None  # None for a remote model (the endpoint sends text), and while a local prompt renders
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
    sampler: SamplerState
    overflow: str = "stop"
    raw: bool = False  # a plain-text document (BOS + text), no chat template
    seq: Sequence | None = None  # its slot and cached tokens survive between turns
    turn: Turn | None = None
    last_used: float = field(default_factory=time.monotonic)
    cut: tuple[int, dict] | None = None  # the oldest messages the last turn left out, and the first one it kept

    def resume_at(self, request: TurnRequest) -> int:
        """The last turn's cut where this request still holds its first kept message there (0: none)."""
        if self.cut is None:
            return 0
        dropped, first = self.cut
        return dropped if dropped < len(request.messages) and request.messages[dropped] == first else 0

    def remember_cut(self, request: TurnRequest, dropped: int) -> None:
        self.cut = (dropped, dict(request.messages[dropped])) if dropped else None

    def begin(self, request: TurnRequest) -> None:
        """Takes the turn's params; a seed set in them seeds every turn, so the same turn draws the same tokens."""
        self.sampler.update(request.params)
        self.sampler.begin_turn()

    def cached_ids(self) -> list[int]:
        if self.seq is None or self.seq.slot is None:
            return []
        return self.seq.token_ids[: self.seq.num_cached]


def render_turn(request: TurnRequest, raw: bool, overflow: str, tok: Tokenizer, limit: int,
                resume: int = 0) -> tuple[list[int], int]:
    """Token ids of the whole conversation plus the generation prompt, applying the overflow policy.

    `continue_final` leaves the last (assistant) message open instead, to generate more of it; a token-id prompt is
    its ids as given. Returns (ids, dropped) where `dropped` counts the oldest messages left out to fit `limit`. `resume`: how many the
    session's last turn left out (`Session.resume_at`), kept while the rest fits, so its tokens stay cached.
    """
    _check_size(request, raw, overflow, tok, limit)
    if request.prompt_ids is not None:
        ids = _given_ids(request.prompt_ids, tok)
    elif raw and request.suffix is not None:
        ids = _fill_in_middle(request, tok)
    elif raw:
        ids = tok.encode(request.document, add_bos=True)
    else:
        ids = _render(request, tok)
    if not ids:  # an empty text where the model writes no BOS: its turn waited forever for a first token
        raise ParleyError("The prompt is empty and this model starts no text with a BOS token: send some text.")
    if overflow != "truncate" or raw:
        if len(ids) < limit:
            return ids, 0
    else:
        fitting = _truncated(request, ids, tok, limit, resume)
        if fitting is not None:
            return fitting
    raise ContextOverflowError(_overflow_message(len(ids), limit, raw, overflow, at_least=False,
                                                   alone=_alone(request), system=_has_system(request)))


def _given_ids(ids: tuple[int, ...], tok: Tokenizer) -> list[int]:
    """A token-id prompt as the client sent it, BOS or none (vLLM's rule: the ids are the document)."""
    outside = next((t for t in ids if t >= tok.vocab_size), None)
    if outside is not None:
        raise ParleyError(f"The prompt holds token id {outside}, outside this model's vocabulary of "
                          f"{tok.vocab_size:,} tokens (ids 0-{tok.vocab_size - 1}).")
    return list(ids)


def _fill_in_middle(request: TurnRequest, tok: Tokenizer) -> list[int]:
    fmt = fim_format(tok)
    if fmt is None:
        raise ParleyError("This model was not trained to fill in the middle: its vocabulary holds no such markers.")
    return fim_ids(tok, fmt, request.document, request.suffix)


def _render(request: TurnRequest, tok: Tokenizer, skip: int = 0) -> list[int]:
    """The chat template over the conversation without its `skip` oldest messages."""
    return tok.apply_chat_template(request.conversation(skip), continue_final=request.continue_final,
                                   thinking=request.params.thinking, tools=request.tools)


def _truncated(request: TurnRequest, ids: list[int], tok: Tokenizer, limit: int,
               resume: int) -> tuple[list[int], int] | None:
    """`truncate`: the conversation as it is while it leaves room for the answer (its max_tokens, at most a quarter of
    the context); else from where the last turn cut it, while that leaves the room; else without the fewest oldest
    turns that bring it under half the context, as llama.cpp's context shift halves it: a cut moved every turn made
    every turn past the context prefill its whole prompt again (90 s a turn at 8k on a CPU), and dropping only what
    kept the prompt under the limit left later answers cut by `context_full` a few tokens in. Where no cut reaches
    half, or where reaching it leaves the last message alone (a long last answer: "shorten it" went without the answer
    it named), the fewest that make the room; where none makes it, the fewest that fit."""
    room = min(request.params.max_tokens, limit // ANSWER_ROOM_SHARE)
    if len(ids) + room <= limit:
        return ids, 0
    if 0 < resume < len(request.messages) - 1 and request.messages[resume]["role"] == "user":
        kept = _render(request, tok, resume)
        if len(kept) + room <= limit:
            return kept, resume
    fitting = _fewest_dropped(request, tok, limit // 2)
    if fitting is None or fitting[1] == len(request.messages) - 1:
        fitting = _fewest_dropped(request, tok, limit - room + 1) or fitting
    if fitting is None and len(ids) < limit:
        return ids, 0
    return fitting or _fewest_dropped(request, tok, limit)


def _fewest_dropped(request: TurnRequest, tok: Tokenizer, limit: int) -> tuple[list[int], int] | None:
    """(ids, dropped) leaving out the fewest oldest messages that make the conversation shorter than `limit`, resuming
    at a user turn; None when even the last user turn alone does not fit. A binary search: dropping more never renders
    longer, and rendering once per dropped message took minutes on a long chat (500 messages: 113 s before every answer)."""
    starts = [k for k in range(1, len(request.messages)) if request.messages[k]["role"] == "user"]
    lo, hi, found = 0, len(starts) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        ids = _render(request, tok, starts[mid])
        if len(ids) < limit:
            found, hi = (ids, starts[mid]), mid - 1
        else:
            lo = mid + 1
    return found


def _check_size(request: TurnRequest, raw: bool, overflow: str, tok: Tokenizer, limit: int) -> None:
    """Refuses at once text that cannot fit however it tokenises (a pasted 100 MB file), before the template and
    the tokenizer spend minutes and gigabytes on it. With `truncate` only the last message and system prompt must fit."""
    kept = request.messages if raw or overflow != "truncate" else request.messages[-1:]
    chars = sum(len(m["content"]) for m in kept) + len(request.suffix or "")
    chars += 0 if raw else len(request.system_prompt or "")
    least = chars // (2 * tok.max_token_chars)  # 2x: normalisation may lengthen text a little
    if least >= limit:
        raise ContextOverflowError(_overflow_message(least, limit, raw, overflow, at_least=True, alone=_alone(request),
                                                     system=_has_system(request)))


def _alone(request: TurnRequest) -> bool:
    """Whether the turn's message is the conversation's only one (besides a system prompt): no older turns to drop."""
    return sum(m["role"] != "system" for m in request.messages) <= 1


def _has_system(request: TurnRequest) -> bool:
    return bool(request.system_prompt) or any(m["role"] == "system" for m in request.messages)


def _overflow_message(needed: int, limit: int, raw: bool, overflow: str, at_least: bool, alone: bool = False,
                      system: bool = False) -> str:
    """What did not fit and the one remedy that helps: with `truncate`, or with no older turns, only the last message
    can be too long, so "leave out the oldest turns" would not help there."""
    # the answer needs a token of room too: "needs 384 tokens but the context holds 384" read as if it fitted
    count = f"{'at least ' if at_least else ''}{needed:,} tokens and one more for the answer, but the context holds {limit:,}"
    if raw:
        return f"The prompt needs {count}. Shorten it."
    with_system = " (with the system prompt)" if system else ""  # `parley generate` has none to name
    if alone:
        return f"The message{with_system} needs {count}. Shorten it."
    if overflow == "truncate":
        return f"The last message{with_system} needs {count}. Shorten it."
    return f"The conversation needs {count}. Shorten the message or leave out the oldest turns."


def as_prompted(answer: str, prompt_tail: str) -> str:
    """The continued `answer` as its prompt ends (`prompt_tail`: the prompt's last text): without its trailing
    whitespace where the chat template trimmed it (Gemma's `| trim`, transformers' cut), since the new text the model
    writes then starts from the trimmed end; appended to the untrimmed answer it would double a newline or a space."""
    kept = answer.rstrip()
    tail = answer[len(kept):]
    return answer if not tail or prompt_tail.endswith(tail) else kept


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
