"""A model's tool calls: the format its chat template writes them in, the grammar of a call a client requires, and
the calls read back out of an answer's text (streamed or whole).

Formats, by what the template writes (as vLLM's and llama.cpp's parsers read them):
- `hermes` (Qwen 2.5 / 3, Hermes, SmolLM3): `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one block a call;
- `llama3` (Llama 3.1 / 3.2 / 3.3): the answer is `{"name": …, "parameters": {…}}` (after `<|python_tag|>`, a special
  token the text leaves out), calls separated by `;`;
- `mistral`: `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from engine.constraint.grammar import JSON_WHITESPACE, closed, lark_grammar
from engine.errors import ParleyError
from engine.tokenizer.detokenizer import partial_suffix

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL_TAG = "[TOOL_CALLS]"
_PYTHON_TAG = "<|python_tag|>"
_ARGUMENTS = {"hermes": "arguments", "llama3": "parameters", "mistral": "arguments"}  # the key a format writes
_ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends a call's arguments


def tool_format(template: str | None) -> str | None:
    """The format a chat template writes tool calls in, or None where it takes no tools (or writes them some other
    way: a client's tools would be sent to a model whose calls could not be read back)."""
    if not template or "tools" not in template:
        return None
    if _HERMES_OPEN in template:
        return "hermes"
    if _MISTRAL_TAG in template:
        return "mistral"
    if _PYTHON_TAG in template:
        return "llama3"
    return None


def call_grammar(fmt: str, tools: list[dict[str, Any]]) -> str:
    """The grammar of one call to one of `tools` (OpenAI's tool objects), written as `fmt` writes it: what
    `tool_choice` "required", or a named function, holds an answer to."""
    key = _ARGUMENTS[fmt]
    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               key: t["function"].get("parameters") or _ANY_ARGUMENTS},
              "required": ["name", key]} for t in tools]
    schema = {**closed({"anyOf": calls}), "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}
    body = f"%json {json.dumps(schema)}"
    if fmt == "hermes":
        return lark_grammar(f'start: "{_HERMES_OPEN}\\n" call "\\n{_HERMES_CLOSE}"\ncall: {body}')
    if fmt == "mistral":
        return lark_grammar(f'start: "{_lark_escaped(_MISTRAL_TAG)}[" call "]"\ncall: {body}')
    return lark_grammar(f"start: call\ncall: {body}")


def _lark_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def parse_calls(fmt: str, text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    """An answer's text -> (its content, the tool calls it makes). A call must name one of `names` and carry a JSON
    object; text that is not such a call stays content, whole (a model that wrote something call-shaped but wrong is
    shown what it wrote rather than losing it)."""
    if fmt == "hermes":
        return _hermes(text, names)
    head = text.lstrip()
    if fmt == "mistral" and head.startswith(_MISTRAL_TAG):
        head = head[len(_MISTRAL_TAG):]
    elif fmt == "llama3" and head.startswith(_PYTHON_TAG):
        head = head[len(_PYTHON_TAG):]
    calls = _json_calls(head, _ARGUMENTS[fmt], names)
    return ("", calls) if calls else (text, [])


def _hermes(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    start = text.find(_HERMES_OPEN)
    if start < 0:
        return text, []
    calls = []
    for body in re.findall(rf"{re.escape(_HERMES_OPEN)}(.*?)(?:{re.escape(_HERMES_CLOSE)}|\Z)", text[start:], re.S):
        found = _json_calls(body, "arguments", names)
        if len(found) != 1:
            return text, []
        calls += found
    return text[:start].rstrip(), calls


def _json_calls(text: str, key: str, names: set[str]) -> list[ToolCall]:
    """The calls in `text`: JSON objects (or arrays of them) separated by `;`, `,` or whitespace; [] unless every
    one is a call."""
    decoder, at, calls = json.JSONDecoder(), 0, []
    text = text.strip()
    while at < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return []
        for item in value if isinstance(value, list) else [value]:
            call = _call(item, key, names)
            if call is None:
                return []
            calls.append(call)
        while at < len(text) and text[at] in " \t\r\n;,":
            at += 1
    return calls


def _call(item: Any, key: str, names: set[str]) -> ToolCall | None:
    if not isinstance(item, dict) or item.get("name") not in names:
        return None
    arguments = item.get(key, item.get("arguments", item.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(item["name"], json.dumps(arguments, ensure_ascii=False))


class CallStream:
    """An answer's content as it streams, with whatever may be a tool call held back: text before a call goes out as
    it comes; from where a call may begin, nothing goes out until the answer ends (`finish` reads the calls). In the
    formats whose whole answer is the call, its first characters decide: `{`, `[` or the format's tag hold it all."""

    def __init__(self, fmt: str, names: set[str]) -> None:
        self.fmt, self.names = fmt, names
        self._held, self._state = "", "open"  # open: undecided; held: a call may be under way; free: plain text

    def feed(self, text: str) -> str:
        """The content of `text` that can go out now."""
        self._held += text
        if self._state == "held":
            return ""
        if self.fmt == "hermes":  # whitespace before a call is not content (parse_calls drops it too): held
            out = _before_marker(self._held, _HERMES_OPEN).rstrip()
            if _HERMES_OPEN in self._held:
                self._state = "held"
        elif self._state == "free":
            out = self._held
        else:
            head, opener = self._held.lstrip(), _MISTRAL_TAG if self.fmt == "mistral" else _PYTHON_TAG
            if head[:1] in ("[", "{") or head.startswith(opener):
                self._state = "held"
            elif head and not opener.startswith(head):
                self._state = "free"
            out = self._held if self._state == "free" else ""
        self._held = self._held[len(out):]
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not sent yet, the calls) once the answer has ended by itself."""
        return parse_calls(self.fmt, self.release(), self.names)

    def release(self) -> str:
        """What is held, as text (an answer cut short: no call is read out of it)."""
        held, self._held = self._held, ""
        return held


def _before_marker(text: str, marker: str) -> str:
    """The part of `text` before `marker`, or before a tail that may be its start."""
    at = text.find(marker)
    if at >= 0:
        return text[:at]
    return text[:len(text) - partial_suffix(text, (marker,))]


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """OpenAI's `tools` as given, checked: a list of {"type": "function", "function": {"name", "description"?,
    "parameters"?}}; a ParleyError naming what is wrong."""
    if not isinstance(tools, list) or not tools:
        raise ParleyError("'tools' must be a non-empty array of tools.")
    seen = set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise ParleyError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}.")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ParleyError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-', not {name!r}.")
        if name in seen:
            raise ParleyError(f"tools[{i}].function.name {name!r} names two tools.")
        seen.add(name)
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise ParleyError(f"tools[{i}].function.parameters must be a JSON schema (an object).")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise ParleyError(f"tools[{i}].function.description must be a string.")
    return tools
