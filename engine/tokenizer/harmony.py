"""gpt-oss's harmony format at the text edge: an answer is messages on channels
(`<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`), shown as a reasoning
model's text: the analysis in `<think>…</think>`, the final message as the reply, the markup gone. Earlier answers go
back to the template without their thought (its own rule: only final messages are kept)."""
from __future__ import annotations

import re
from collections.abc import Callable

from engine.tokenizer.detokenizer import partial_suffix

CHANNEL, MESSAGE, START, END, RETURN, CALL = "<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>", "<|call|>"
TAGS = (CHANNEL, MESSAGE, START, END, RETURN, CALL, "<|constrain|>")
HIDDEN = "<hidden>"  # a message not shown (not a channel name: those never hold "<")
THOUGHT = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


def is_harmony(token_to_id: Callable[[str], int | None]) -> bool:
    """Whether a vocabulary speaks harmony (gpt-oss's o200k_harmony)."""
    return all(token_to_id(t) is not None for t in (CHANNEL, MESSAGE, RETURN, CALL))


def without_thought(text: str) -> str:
    """An earlier answer as harmony's template takes it back: the reply only."""
    return THOUGHT.sub("", text, count=1)


def answer_markup(text: str) -> str:
    """An answer as harmony writes it after the generation prompt's `<|start|>assistant`, to continue it: its thought
    on the analysis channel (left open where the answer was cut while thinking), its reply on the final one."""
    if not text.lstrip().startswith("<think>"):
        return f"{CHANNEL}final{MESSAGE}{text}"
    thought, closed, reply = text.lstrip()[len("<think>"):].partition("</think>")
    analysis = f"{CHANNEL}analysis{MESSAGE}{thought}"
    return f"{analysis}{END}{START}assistant{CHANNEL}final{MESSAGE}{reply.lstrip()}" if closed else analysis


class HarmonyText:
    """Streams an answer's text (its harmony tags shown by the detokenizer) as thought-tagged text: every analysis
    message before the reply is one thought (gpt-oss may write several in a row), the other messages the reply, a
    blank line between them."""

    def __init__(self) -> None:
        self._held = ""
        self._channel: str | None = None  # None: between messages (a header is being read)
        self._thought = "none"  # none, open (its `</think>` waits for the next message), closed
        self._replied = False  # reply text was written: a later message starts on a new paragraph

    def feed(self, piece: str) -> str:
        self._held += piece
        out = []
        while self._held:
            if self._channel is None:
                if not self._read_header(out):
                    break
            elif not self._read_body(out):
                break
        return "".join(out)

    def finish(self) -> str:
        """What is held at the end: a message's partial text (a header's is dropped), or the close of a thought whose
        message ended."""
        held, self._held = self._held, ""
        if self._channel is None:
            return "</think>" if self._thought == "open" else ""
        return held if self._channel != HIDDEN else ""

    def _read_header(self, out: list[str]) -> bool:
        text = self._held.lstrip()
        if text and not text.startswith("<|") and not "<|".startswith(text):
            self._held = text
            self._begin("final", out)  # no header: plain text is the reply
            return True
        at = text.find(MESSAGE)
        if at < 0:
            if self._thought == "open" and _names_other_channel(text):  # the reply is coming: the thought ends now
                self._close_thought(out)
            return False
        header, self._held = text[:at], text[at + len(MESSAGE):]
        name = header.rpartition(CHANNEL)[2].split()
        self._begin(name[0] if name else "final", out)
        return True

    def _begin(self, channel: str, out: list[str]) -> None:
        if channel != "analysis":
            self._close_thought(out)
            if self._replied:
                out.append("\n\n")
        elif self._thought == "none":
            out.append("<think>")
            self._thought = "open"
        elif self._thought == "open":
            out.append("\n\n")  # another analysis message: the same thought goes on
        else:
            channel = HIDDEN  # thinking after the reply began: a thought shows only before the reply
        self._channel = channel

    def _close_thought(self, out: list[str]) -> None:
        if self._thought == "open":
            out.append("</think>")
            self._thought = "closed"
        elif self._thought == "none":
            self._thought = "closed"

    def _read_body(self, out: list[str]) -> bool:
        ends = [(i, tag) for tag in (END, RETURN, CALL, START) if (i := self._held.find(tag)) >= 0]
        if not ends:
            keep = _partial_tag(self._held)
            self._write(self._held[:len(self._held) - keep], out)
            self._held = self._held[len(self._held) - keep:]
            return False
        at, tag = min(ends)
        self._write(self._held[:at], out)
        self._held = self._held[at + (len(tag) if tag != START else 0):]
        self._channel = None
        return True

    def _write(self, text: str, out: list[str]) -> None:
        if text and self._channel != HIDDEN:
            out.append(text)
            self._replied = self._replied or self._channel != "analysis"


def _names_other_channel(header: str) -> bool:
    """Whether a header being read already names a channel other than analysis."""
    if CHANNEL not in header:
        return False
    name = header.rpartition(CHANNEL)[2].partition("<")[0].split()  # up to a tag that may be starting
    return bool(name) and not "analysis".startswith(name[0])


def _partial_tag(text: str) -> int:
    """Length of the longest suffix of `text` that begins a tag (held until the tag completes or cannot)."""
    return partial_suffix(text, TAGS)
