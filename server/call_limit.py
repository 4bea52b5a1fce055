"""`parallel_tool_calls: false`: OpenAI's "zero or one tool is called". A model is stopped where its first call ends:
the answer ends with it (finish_reason "tool_calls"), where it had gone on writing calls nobody would get until it
ended by itself or at max_tokens ("length"), and then on to where a second call's name was known."""
from __future__ import annotations

from server.protocol import ReasoningSplit
from server.tools import ToolRequest


class CallLimit:
    """One whole (not streamed) answer's text read as it comes, to stop it where its one call ends."""

    def __init__(self, tools: ToolRequest, prefix: str = "") -> None:
        self._split, self._calls = ReasoningSplit(prefix), tools.stream()  # calls are read in the reply, not a thought

    @property
    def full(self) -> bool:
        """The answer's one call has ended (or a call past it began)."""
        return self._calls.full

    def reached(self, text: str) -> bool:
        """True once: as the answer, `text` added, ends its one call (the moment to stop it)."""
        if self.full:
            return False
        content = self._split.feed(text).get("content")
        if content:
            self._calls.feed(content)
        return self.full


def call_limits(tools: ToolRequest | None, choices: int, prefix: str = "") -> list[CallLimit] | None:
    """Each choice's CallLimit where the request allows one call an answer; None where it allows any."""
    if tools is None or tools.parallel:
        return None
    return [CallLimit(tools, prefix) for _ in range(choices)]
