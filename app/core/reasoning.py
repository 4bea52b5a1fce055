"""A reasoning model's answer split into its thought and its reply: Qwen3, QwQ and DeepSeek-R1 (and their distills)
write `<think>…</think>` before the reply, Magistral `[THINK]…[/THINK]`, Seed-OSS `<seed:think>…</seed:think>`; an
R1 distill's template opens the tag in the prompt (older answers hold only the closing one)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.tokenizer.tokenizer import THOUGHT_TAGS as TAGS  # (open, close) at the start of an answer

OPEN, CLOSE = TAGS[0]
ONLY_CLOSED = (CLOSE, "</seed:think>")  # closing tags an answer may hold without the opening one
RESPONSE = ("<response>", "</response>")


@dataclass(frozen=True, slots=True)
class Reasoning:
    thought: str | None  # None: the text has no thought
    reply: str
    thinking: bool  # the thought is not closed yet (still streaming, or cut short)


def split_reasoning(text: str) -> Reasoning:
    stripped = text.lstrip()
    for open_tag, close_tag in TAGS:
        if stripped.startswith(open_tag):
            thought, closed, reply = stripped[len(open_tag):].partition(close_tag)
            return Reasoning(thought.strip(), _unwrapped(reply.lstrip()) if closed else "", not closed)
    # a prompt opened the thought: an R1 distill's `<think>`, Seed-OSS's told to skip thinking (a budget of 0)
    close = min((tag for tag in ONLY_CLOSED if tag in text), key=text.find, default=CLOSE)
    thought, closed, reply = text.partition(close)
    # "the `</think>` tag", or the tag in a code block: an answer about tags, not the end of a thought
    quoted = thought.endswith("`") or reply.startswith("`") or thought.count("```") % 2 == 1
    if closed and OPEN not in thought and not quoted:
        return Reasoning(thought.strip(), reply.lstrip(), False)
    return Reasoning(None, text, False)


def _unwrapped(reply: str) -> str:
    """A reply without the `<response>…</response>` Granite's thinking mode writes around it."""
    if not reply.startswith(RESPONSE[0]):
        return reply
    body = reply[len(RESPONSE[0]):].lstrip()
    trimmed = body.rstrip()
    return trimmed[:-len(RESPONSE[1])].rstrip() if trimmed.endswith(RESPONSE[1]) else body


def reply_text(text: str) -> str:
    """What the answer says, without its thought (what the next turn reads back)."""
    return split_reasoning(text).reply


def copied_text(text: str) -> str:
    """What Copy copies: the reply, or the thought of an answer cut short before its reply began (not an empty
    clipboard)."""
    reasoning = split_reasoning(text)
    return reasoning.reply if reasoning.reply.strip() or reasoning.thought is None else reasoning.thought
