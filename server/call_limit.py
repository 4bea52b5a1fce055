"""`parallel_tool_calls: false`: OpenAI's "zero or one tool is called". A model that begins a second call is stopped
there: the answer ends with its first call (finish_reason "tool_calls"), where it had gone on writing calls nobody
would get until it ended by itself or at max_tokens ("length")."""
from __future__ import annotations

from server.protocol import ReasoningSplit
from server.tools import ToolRequest


class CallLimit:
    """One whole (not streamed) answer's text read as it comes, to stop it where it begins a call past its one."""

    def __init__(self, tools: ToolRequest, prefix: str = "") -> None:
        self._split, self._calls = ReasoningSplit(prefix), tools.stream()  # calls are read in the reply, not a thought

    @property
    def full(self) -> bool:
        """The answer has begun a call past its limit."""
        return self._calls.full

    def reached(self, text: str) -> bool:
        """True once: as the answer, `text` added, begins a call past its limit (the moment to stop it)."""
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
