"""The forms tool calls take in a model's text, one reader each: what opens a model's calls, and the calls read from
there, as far as the text goes (engine/tool_calls.py streams them as they grow).

A reader is given the text from where a call section may begin and reads it again whole at each new piece (a
stream's own Qwen XML or GLM reader resumes after the arguments it read whole: engine/tool_call_xml.py): it
reports the calls whose name is known with their arguments' text so far (only ever growing: a name is reported once
certain, an argument's character once it cannot be anything else), where the section ended (its text after is the
answer's again), or where the text stopped being calls. A call's arguments are the JSON object the model wrote, as
it wrote it (OpenAI's arguments are the model's text too, not always valid JSON).

Markers that are control tokens (Mistral's [TOOL_CALLS] and [ARGS], Granite's <|tool_call|>, Llama 3's
<|python_tag|>, DeepSeek's <｜tool▁…｜> as GGUFs type them) are left out of the text the engine decodes; each form is
read with or without them.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_SCALAR_END = re.compile(r"[,}\]\s]")
_CALL_ID = re.compile(r"[A-Za-z0-9]*")
_CALL_KEYS = {"name", "arguments", "parameters", "type", "id"}  # what a JSON call holds (Llama 3.2 adds "type")
_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.S)  # a JSON string's characters, up to its closing quote
_STRUCTURE = re.compile(r'["{}\[\]]')
DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
DS_FENCE, DS_FENCE_END = "\n```json\n", "\n```"


class Bad(Exception):
    """The text read is not (the start of) a call."""


@dataclass(slots=True)
class Section:
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments' text so far)
    end: int | None = None  # where the calls ended: the text after is content again
    bad: int | None = None  # where the text stopped being calls (0: none of it is)
    done: int = 0  # the calls whose text has ended (nothing after them can change them)
    # the text ends inside an argument's value that is not text (Qwen XML, GLM): it goes out whole at its closing tag
    quiet: bool = False


Reader = Callable[[str, Mapping[str, dict]], Section]  # names: each tool's parameters schema


# -- JSON, read as far as it goes
def skip(text: str, i: int, chars: str = " \t\r\n") -> int:
    while i < len(text) and text[i] in chars:
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """text[i] is '"': the index after its closing quote, None while it goes on."""
    end = _STRING_BODY.match(text, i + 1).end()
    return end + 1 if end < len(text) and text[end] == '"' else None


def value_end(text: str, i: int) -> int | None:
    """The index after the JSON value starting at i, None while it may go on."""
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] not in "{[":
        found = _SCALAR_END.search(text, i)
        return found.start() if found else None
    depth = 0
    while found := _STRUCTURE.search(text, i):  # regular expressions: a call's text is read again at each token
        at = found.start()
        if text[at] == '"':
            i = _string_end(text, at)
            if i is None:
                return None
            continue
        depth += 1 if text[at] in "{[" else -1
        i = at + 1
        if depth == 0:
            return i
    return None


def _members(text: str, i: int) -> tuple[dict[str, tuple[int, int | None]], int | None, int | None]:
    """The object at text[i] == '{': its members read so far (key -> value's start, end or None), the index after
    its closing brace (None while it goes on) and where it stopped being an object (None while it is one)."""
    members: dict[str, tuple[int, int | None]] = {}
    i += 1
    while True:
        i = skip(text, i, " \t\r\n,")
        if i >= len(text):
            return members, None, None
        if text[i] == "}":
            return members, i + 1, None
        if text[i] != '"':
            return members, None, i
        key_end = _string_end(text, i)
        colon = skip(text, key_end) if key_end else len(text)
        if colon >= len(text):
            return members, None, None
        if text[colon] != ":":
            return members, None, colon
        start = skip(text, colon + 1)
        if start >= len(text):
            return members, None, None
        end = value_end(text, start)
        members[json.loads(text[i:key_end])] = (start, end)
        if end is None:
            return members, None, None
        i = end


def arguments_at(text: str, start: int, end: int | None) -> str | None:
    """A call's arguments from the value at `start`: an object's text so far; a string holding an object's JSON once
    it has ended (some models write it so), else None; Bad for anything else."""
    if text[start] == "{":
        return text[start:end]
    if text[start] != '"':
        raise Bad
    if end is None:
        return None
    inner = json.loads(text[start:end])
    try:
        ok = isinstance(json.loads(inner), dict)
    except ValueError:
        ok = False
    if not ok:
        raise Bad
    return inner.strip()


def json_call(text: str, i: int, names: Mapping[str, dict]) -> tuple[tuple[str, str] | None, int | None]:
    """The call object at text[i] ({"name": ..., "arguments" or "parameters": {...}}, either order): the call once its
    name is known and its arguments begun, and the index after the object (None while it goes on; where it stopped
    being JSON once the call was whole: the text after is not the call's)."""
    if text[i] != "{":
        raise Bad
    members, end, broken = _members(text, i)
    if not set(members) <= _CALL_KEYS:  # plain JSON, not a call: said at its first other key, not at its end
        raise Bad
    name = None
    if "name" in members and members["name"][1] is not None:
        start, stop = members["name"]
        name = json.loads(text[start:stop]) if text[start] == '"' else None
        if name not in names:
            raise Bad
    key = next((k for k in ("arguments", "parameters") if k in members), None)
    closed = end is not None or broken is not None
    arguments = arguments_at(text, *members[key]) if key else "{}" if closed else None
    if closed and (name is None or key and members[key][1] is None):
        raise Bad
    return ((name, arguments) if name is not None and arguments is not None else None), end or broken


# -- sections
def sequence(text: str, i: int, names: Mapping[str, dict], one, seps: str, close: str | None) -> Section:
    """Calls read by `one` from i on, apart by whitespace and `seps`, up to `close` (None: up to what is not a call)."""
    out = Section()
    while True:
        j = skip(text, i, " \t\r\n" + seps)
        if close is not None and text.startswith(close, j):
            out.end = j + len(close)
            return out
        if j >= len(text) or close is not None and close.startswith(text[j:]):
            return out
        try:
            call, end = one(text, j, names)
        except Bad:  # without a closing text, what follows the calls is the answer's again
            out.bad, out.end = (0, None) if not out.calls else (None, i) if close is None else (j, None)
            return out
        if call is not None:
            out.calls.append(call)
        if end is None:
            return out
        out.done = len(out.calls)
        i = end


def opened(text: str, openers: tuple[str, ...]) -> int:
    """The index after whichever opener the text begins with (0 where none: it was a control token)."""
    return next((len(o) for o in openers if text.startswith(o)), 0)


def json_section(openers: tuple[str, ...], close: str | None = None) -> Reader:
    """Calls as JSON objects after an opener: a `[...]` list of them, or (Llama 3) objects apart by ';'."""
    def read(text: str, names: Mapping[str, dict]) -> Section:
        i = skip(text, opened(text, openers))
        if i < len(text) and text[i] == "[":
            return sequence(text, i + 1, names, json_call, ",", "]")
        return sequence(text, i, names, json_call, ";,", close)
    return read


def block_section(one) -> Reader:
    """`<tool_call>…</tool_call>`: one call a block, read by `one` (the closing tag may be missing at the answer's
    end)."""
    def read(text: str, names: Mapping[str, dict]) -> Section:
        i = skip(text, opened(text, ("<tool_call>",)))
        if i >= len(text):
            return Section()
        try:
            call, end = one(text, i, names)
        except Bad:
            return Section(bad=0)
        out = Section([call] if call else [])
        if end is not None:
            out.done, after = len(out.calls), skip(text, end)
            out.end = after + len("</tool_call>") if text.startswith("</tool_call>", after) else \
                None if "</tool_call>".startswith(text[after:]) else end
        return out
    return read


def named_call(text: str, i: int, names: Mapping[str, dict]) -> tuple[tuple[str, str] | None, int | None]:
    """Mistral v11: `name[ARGS]{...}` (`[CALL_ID]id` may come between; the control tokens may be left out)."""
    j = _after_marker(text, i, "[TOOL_CALLS]")
    found = NAME.match(text, j) if j is not None else None
    if j is None or j >= len(text):
        return None, None
    if found is None:
        raise Bad
    j = found.end()
    if j >= len(text):
        return None, None  # the name may go on
    if found.group() not in names:
        raise Bad
    j = _after_marker(text, j, "[CALL_ID]")
    if j is not None and j > found.end():
        j = _CALL_ID.match(text, j).end()
    j = _after_marker(text, j, "[ARGS]") if j is not None and j < len(text) else None
    if j is None or j >= len(text):
        return None, None
    if text[j] != "{":
        raise Bad
    end = value_end(text, j)
    return (found.group(), text[j:end]), end


def _after_marker(text: str, j: int, marker: str) -> int | None:
    """The index after `marker` where text[j:] begins with it, j where it does not, None while it may."""
    if text.startswith(marker, j):
        return j + len(marker)
    return None if text[j:] and marker.startswith(text[j:]) else j


def mistral_named_section(text: str, names: Mapping[str, dict]) -> Section:
    return sequence(text, opened(text, ("[TOOL_CALLS]",)), names, named_call, "", None)


def deepseek_call(text: str, i: int, names: Mapping[str, dict]) -> tuple[tuple[str, str] | None, int | None]:
    """V3 / R1: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>name` + a ```json fence + `<｜tool▁call▁end｜>` (the control
    tokens may be left out: a GGUF types them control, and the decoded text drops them)."""
    j = _after_marker(text, i, DS_CALL)
    j = _expect(text, j, "function") if j is not None else None
    j = _after_marker(text, j, DS_SEP) if j is not None and j < len(text) else None
    found = _ds_name(text, j, names)
    if found is None:
        return None, None
    j = _expect(text, found.end(), DS_FENCE)
    return _ds_arguments(text, j, found.group()) if j is not None else (None, None)


def deepseek_v3_1_call(text: str, i: int, names: Mapping[str, dict]) -> tuple[tuple[str, str] | None, int | None]:
    """V3.1: `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (the control tokens may be left out)."""
    found = _ds_name(text, _after_marker(text, i, DS_CALL), names)
    if found is None:
        return None, None
    j = _after_marker(text, found.end(), DS_SEP)
    return _ds_arguments(text, j, found.group()) if j is not None else (None, None)


def _ds_name(text: str, j: int | None, names: Mapping[str, dict]) -> re.Match | None:
    """The tool's name at j, None while the text may still be writing it; Bad for no name or one of no tool."""
    found = NAME.match(text, j) if j is not None and j < len(text) else None
    if found is None or found.end() >= len(text):
        if j is not None and found is None and j < len(text):
            raise Bad
        return None
    if found.group() not in names:
        raise Bad
    return found


def _expect(text: str, j: int, literal: str) -> int | None:
    """The index after `literal` at j, None while the text may still write it; Bad where it does not."""
    if text.startswith(literal, j):
        return j + len(literal)
    if literal.startswith(text[j:]):
        return None
    raise Bad


def _ds_arguments(text: str, j: int, name: str) -> tuple[tuple[str, str] | None, int | None]:
    """The arguments' object at j, then its fence's end and `<｜tool▁call▁end｜>` where they are written."""
    if j >= len(text):
        return None, None
    if text[j] != "{":
        raise Bad
    end = value_end(text, j)
    call = (name, text[j:end])
    if end is None:
        return call, None
    k = end + len(DS_FENCE_END) if text.startswith(DS_FENCE_END, end) else end
    if text.startswith(DS_CALL_END, k):
        return call, k + len(DS_CALL_END)
    ending = text[end:]
    return call, None if (DS_FENCE_END + DS_CALL_END).startswith(ending) or DS_CALL_END.startswith(ending) else k


def deepseek_section(one) -> Reader:
    """DeepSeek's calls, read by `one`, up to `<｜tool▁calls▁end｜>` (or where the text stops being calls)."""
    def read(text: str, names: Mapping[str, dict]) -> Section:
        return sequence(text, opened(text, (DS_CALLS,)), names, one, "", DS_CALLS_END)
    return read
