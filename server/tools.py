"""`tools` and `tool_choice` (OpenAI's function calling): which tools the model is shown, whether a call is required,
and the calls read back out of each answer (engine/tool_calls.py knows the model's format)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from engine.errors import ParleyError
from engine.tool_calls import CallDelta, CallStream, ToolCall, call_grammar, check_tools, parse_calls, tools_prompt
from server.api_error import APIError

CHOICES = ("none", "auto", "required")


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """A request's tools as the model sees them, and how its answers are read."""

    tools: tuple[dict, ...]
    fmt: str  # the model's call format (engine/tool_calls.py FORMATS)
    grammar: str | None  # a required call's grammar (tool_choice "required" or a named function)
    parallel: bool  # parallel_tool_calls: more than one call an answer

    @property
    def names(self) -> dict[str, dict]:
        """Each tool's name -> its parameters schema."""
        return {t["function"]["name"]: t["function"].get("parameters") or {} for t in self.tools}

    def stream(self) -> CallStream:
        return CallStream(self.fmt, self.names, None if self.parallel else 1)

    def system(self, system: str | None) -> str | None:
        """The request's system prompt, with the tools where the model's template shows none (DeepSeek's)."""
        prompt = tools_prompt(self.fmt, list(self.tools))
        return system if prompt is None else f"{system}\n\n{prompt}" if system else prompt

    def read(self, content: str) -> tuple[str, list[ToolCall]]:
        """A whole answer's content -> (the content left, its calls), as its stream would send them."""
        return parse_calls(self.fmt, content, self.names, None if self.parallel else 1)


class StreamedCalls:
    """One streamed choice's content and tool calls as OpenAI's deltas: a call's first delta carries its index, id,
    type and name (arguments ""), the next ones pieces of its arguments, which a client joins."""

    def __init__(self, tools: ToolRequest, new_id: Callable[[], str]) -> None:
        self._stream, self._new_id = tools.stream(), new_id

    @property
    def called(self) -> bool:
        return self._stream.called

    @property
    def full(self) -> bool:
        """parallel_tool_calls false's one call has ended: the answer is to stop (server/call_limit.py)."""
        return self._stream.full

    def feed(self, content: str) -> list[dict]:
        return self._deltas(self._stream.feed(content))

    def finish(self) -> list[dict]:
        """The last deltas once the answer has ended (by itself or cut short: a call under way stays as written)."""
        return self._deltas(self._stream.finish())

    def _deltas(self, pieces: list[str | CallDelta]) -> list[dict]:
        out: list[dict] = []
        for piece in pieces:
            if isinstance(piece, str) and out and "content" in out[-1]:
                out[-1]["content"] += piece
            elif isinstance(piece, str):
                out.append({"content": piece})
            else:
                out.append({"tool_calls": [self._call(piece)]})
        return out

    def _call(self, piece: CallDelta) -> dict:
        if piece.name is None:
            return {"index": piece.index, "function": {"arguments": piece.arguments}}
        return {"index": piece.index, "id": self._new_id(), "type": "function",
                "function": {"name": piece.name, "arguments": piece.arguments}}


def request_tools(data: dict, fmt: str | None, model: str) -> ToolRequest | None:
    """The request's tools, or None where the model is shown none (no tools, or tool_choice "none"); an APIError
    naming the field for anything it cannot do."""
    tools, choice = data.get("tools"), data.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise APIError(400, "'tool_choice' asks for a call, but the request has no 'tools'.", "tool_choice")
        return None
    try:
        tools = check_tools(tools)
    except ParleyError as exc:
        raise APIError(400, str(exc), "tools") from None
    choice = "auto" if choice is None else choice
    named = _named(choice, tools)
    if choice == "none":
        return None
    if fmt is None:
        raise APIError(400, f"{model} cannot call tools: its chat template shows the model no tools (or writes calls "
                            "in a form this server does not read).", "tools")
    if data.get("response_format") not in (None, {"type": "text"}):
        raise APIError(400, "'response_format' and 'tools' cannot be combined: each holds the answer to its own form.",
                       "response_format")
    parallel = data.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise APIError(400, "'parallel_tool_calls' must be a boolean.", "parallel_tool_calls")
    grammar = None
    if choice == "required" or named is not None:
        try:
            grammar = call_grammar(fmt, [named] if named is not None else tools, parallel and named is None)
        except ParleyError as exc:  # a parameters schema llguidance cannot compile
            raise APIError(400, str(exc), "tools") from None
    return ToolRequest(tuple(tools), fmt, grammar, parallel)


def _named(choice, tools: list[dict]) -> dict | None:
    """The tool a `tool_choice` object names, None for the choices named by a word; an APIError for anything else."""
    if isinstance(choice, str) and choice in CHOICES:
        return None
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise APIError(400, "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}.", "tool_choice")
    tool = next((t for t in tools if t["function"]["name"] == name), None)
    if tool is None:
        raise APIError(400, f"'tool_choice' names {name!r}, which is not one of the request's tools.", "tool_choice")
    return tool


def call_dicts(calls: list[ToolCall], ids: list[str]) -> list[dict]:
    """OpenAI's `tool_calls` of a message."""
    return [{"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c, cid in zip(calls, ids)]


def assistant_calls(calls, i: int) -> list[dict]:
    """An assistant message's `tool_calls` as a chat template reads them: arguments as an object (a template writes
    them with `tojson`; the JSON text OpenAI sends would be quoted twice)."""
    if not isinstance(calls, list):
        raise APIError(400, f"messages[{i}].tool_calls must be an array.", f"messages[{i}].tool_calls")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(400, f"messages[{i}].tool_calls holds a call without its function's name.",
                           f"messages[{i}].tool_calls")
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):  # nested past Python's parser (5,000 brackets): it was a 500
                pass  # kept as the text it is: the template shows what the answer wrote
        out.append({"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": arguments}})
    return out
