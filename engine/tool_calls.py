"""A model's tool calls: the format its chat template writes them in, the grammar of the calls a client requires, and
the calls read back out of an answer's text, streamed as they are written (each call's name once known, then its
arguments piece by piece) or whole (the same reading, so both give the same calls and content).

Formats, by what the template writes (as vLLM's and llama.cpp's parsers read them; engine/tool_formats.py reads each):
- `hermes` (Qwen 2.5 / 3, Hermes, SmolLM3): `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one block a call;
- `llama3` (Llama 3.1 / 3.2 / 3.3): the answer is `{"name": …, "parameters": {…}}` (after `<|python_tag|>`, a special
  token the text leaves out), calls separated by `;`;
- `mistral` (7B v0.3, NeMo, Small 3 / 3.1): `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`;
- `mistral_v11` (Small 3.2, Devstral, Magistral): `[TOOL_CALLS]name[ARGS]{…}`, again for each call;
- `granite` (Granite 3.x): `<|tool_call|>[{"name": …, "arguments": {…}}, …]`;
- `phi4` (Phi-4-mini): `functools[{"name": …, "arguments": {…}}, …]`;
- `deepseek` (V3, R1): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name` + "```json" fenced arguments
  + `<｜tool▁call▁end｜>` …`<｜tool▁calls▁end｜>`;
  `deepseek_v3_1`: `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`;
- `qwen_xml` (Qwen3-Coder, Qwen3.5): `<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>…`
  (engine/tool_call_xml.py);
- `glm` (GLM-4.5, 4.6): `<tool_call>name\n<arg_key>key</arg_key>\n<arg_value>value</arg_value>\n…</tool_call>`
  (engine/tool_call_xml.py).
Text the model writes around its calls is the answer's content (OpenAI returns content and tool_calls together).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from engine.constraint.grammar import (JSON_WHITESPACE, closed, control_rules, control_token, control_until,
                                       lark_grammar)
from engine.errors import ParleyError
from engine.tokenizer.detokenizer import partial_suffix
from engine.tool_call_xml import (GLM_VALUE_ENDS, KEY, KEY_END, VALUE, VALUE_END, XML_VALUE_ENDS, Writers, glm_call,
                                  glm_grammar, glm_reader, xml_call, xml_grammar, xml_reader)
from engine.tool_formats import (DS_CALL, DS_CALL_END, DS_CALLS, DS_CALLS_END, DS_FENCE, DS_FENCE_END, DS_SEP, NAME,
                                 Reader, Section, block_section, deepseek_call, deepseek_section, deepseek_v3_1_call,
                                 json_call, json_section, mistral_named_section, opened)
from engine.tool_string_tail import JsonTail, OpenString

_ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends a call's arguments


@dataclass(frozen=True, slots=True)
class CallDelta:
    """A piece of call `index`: its first piece names it (`name`), the next ones carry its arguments' text."""

    index: int
    name: str | None
    arguments: str


def _json_head(head: str, names: Mapping[str, dict]) -> bool | None:
    """Whether an answer beginning with `head` begins with its calls (a JSON object or list); None: undecided."""
    return head[:1] in ("{", "[") if head else None


def _named_head(head: str, names: Mapping[str, dict]) -> bool | None:
    """Mistral v11 with its tags left out: the answer begins with a tool's name and its arguments."""
    found = NAME.match(head)
    if not head or found and found.end() == len(head) and any(n.startswith(head) for n in names):
        return None
    return bool(found) and found.group() in names and head[found.end():found.end() + 1] in ("[", "{")


def _ds_head(head: str, names: Mapping[str, dict]) -> bool | None:
    """DeepSeek R1 with its control tokens left out: the answer begins `function` + a tool's name + its fence."""
    if len(head) <= len("function") and "function".startswith(head):
        return None
    found = NAME.match(head, len("function")) if head.startswith("function") else None
    if found is None:
        return False
    if found.end() == len(head):
        return None if any(n.startswith(found.group()) for n in names) else False
    return found.group() in names and head[found.end()] == "\n"


@dataclass(frozen=True, slots=True)
class _Format:
    openers: tuple[str, ...]  # text that opens the calls
    read: Reader
    whole: Callable[[str, Mapping[str, dict]], bool | None] | None  # the answer may open with its calls, tag left out
    key: str  # the arguments' key in a JSON call ("": the name and arguments are written apart)
    block: tuple[str, str, str]  # the grammar: (text before the calls, between two, after them)
    call: Callable[[str], tuple[str, str]] | None = None  # a named call's text before and after its arguments
    rules: Callable[..., list[str]] | None = None  # a grammar of its own: (tools, parallel, writers) -> rules
    closers: tuple[str, ...] = ()  # what ends an argument written as text (none: the arguments are JSON as written)
    reader: Callable[[], Reader] | None = None  # a stream's own reader, which remembers what it read (none: `read`)


def _ds_r1(name: str) -> tuple[str, str]:
    return f"{DS_CALL}function{DS_SEP}{name}{DS_FENCE}", f"{DS_FENCE_END}{DS_CALL_END}"


_JSON_LIST = ", "  # between two calls of a JSON list, as the templates write them
FORMATS = {
    "hermes": _Format(("<tool_call>",), block_section(json_call), None, "arguments",
                      ("<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>")),
    "llama3": _Format(("<|python_tag|>",), json_section(("<|python_tag|>",)), _json_head, "parameters", ("", "; ", "")),
    "mistral": _Format(("[TOOL_CALLS]",), json_section(("[TOOL_CALLS]",)), _json_head, "arguments",
                       ("[TOOL_CALLS][", _JSON_LIST, "]")),
    "mistral_v11": _Format(("[TOOL_CALLS]",), mistral_named_section, _named_head, "", ("", "", ""),
                           lambda name: (f"[TOOL_CALLS]{name}[ARGS]", "")),
    "granite": _Format(("<|tool_call|>",), json_section(("<|tool_call|>",)), _json_head, "arguments",
                       ("<|tool_call|>[", _JSON_LIST, "]")),
    "phi4": _Format(("functools[",), json_section(("functools",)), None, "arguments", ("functools[", _JSON_LIST, "]")),
    "deepseek": _Format((DS_CALLS, DS_CALL), deepseek_section(deepseek_call), _ds_head, "",
                        (DS_CALLS, "\n", DS_CALLS_END), _ds_r1),
    "deepseek_v3_1": _Format((DS_CALLS, DS_CALL), deepseek_section(deepseek_v3_1_call), _named_head, "",
                             (DS_CALLS, "", DS_CALLS_END),
                             lambda name: (f"{DS_CALL}{name}{DS_SEP}", DS_CALL_END)),
    "qwen_xml": _Format(("<tool_call>",), block_section(xml_call), None, "", ("", "", ""), rules=xml_grammar,
                        closers=XML_VALUE_ENDS, reader=xml_reader),
    "glm": _Format(("<tool_call>",), block_section(glm_call), None, "", ("", "", ""), rules=glm_grammar,
                   closers=GLM_VALUE_ENDS, reader=glm_reader),
}
_DETECTED = (("<arg_key>", "glm"), ("<function=", "qwen_xml"), (DS_CALL, "deepseek"), ("[ARGS]", "mistral_v11"),
             ("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|tool|>", "phi4"), ("<|tool_call|>", "granite"),
             ("<|python_tag|>", "llama3"))  # in this order: a marker of one may come in another's template
# the template's `tools` variable (Phi-4-mini's own template reads a system message's 'tools' key: shows none of ours)
_SHOWS_TOOLS = re.compile(r"(?<![\w'\".\[])tools\b(?!['\"])")
_PROMPTED = ("deepseek", "deepseek_v3_1")  # their templates show no tools: the system prompt does (tools_prompt)
_DS_NAME_FIRST = re.compile(r"name['\"]\]\s*\+\s*['\"]" + DS_SEP)  # V3.1's template: the name, then the separator


def tool_format(template: str | None) -> str | None:
    """The format a chat template writes tool calls in, or None where it takes no tools (or writes them some other
    way: a client's tools would be sent to a model whose calls could not be read back). DeepSeek's templates write
    calls but never show the tools: `tools_prompt` writes them into the system prompt."""
    fmt = next((f for marker, f in _DETECTED if marker in template), None) if template else None
    if fmt is None or not _SHOWS_TOOLS.search(template) and fmt not in _PROMPTED:
        return None
    return "deepseek_v3_1" if fmt == "deepseek" and _DS_NAME_FIRST.search(template) else fmt


def tools_prompt(fmt: str, tools: list[dict[str, Any]]) -> str | None:
    """The tools as a system prompt says them to a model whose template shows none (DeepSeek's, as its model cards
    write it: each tool's name, description and parameters, then the form of a call); None for the other formats."""
    if fmt not in _PROMPTED:
        return None
    lines = ["## Tools", "You have access to the following tools:", ""]
    for tool in tools:
        function = tool["function"]
        lines += [f"### {function['name']}", f"Description: {function.get('description') or ''}", "",
                  f"Parameters: {json.dumps(function.get('parameters') or _ANY_ARGUMENTS, ensure_ascii=False)}", ""]
    head, tail = FORMATS[fmt].call("tool_call_name")
    before, between, after = FORMATS[fmt].block
    lines += ["IMPORTANT: ALWAYS adhere to this exact format for tool use:",
              f"{before}{head}tool_call_arguments{tail}{between}{{{{additional_tool_calls}}}}{after}", "",
              "Where:", "- `tool_call_name` must be an exact match to one of the available tools",
              "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema"]
    return "\n".join(lines)


def call_grammar(fmt: str, tools: list[dict[str, Any]], parallel: bool = False) -> str:
    """The grammar of a call to one of `tools` (OpenAI's tool objects), written as `fmt` writes it: what
    `tool_choice` "required", or a named function, holds an answer to; `parallel`: one call or more."""
    form = FORMATS[fmt]
    if form.rules is not None:
        return _with_markers(form.rules(tools, parallel, Writers(_lit, _closed, _until)))
    before, between, after = form.block
    rules = [_rule("start", _lit(before), "call", f"({_lit(between)} call)*" if parallel else "", _lit(after))]
    if form.call is None:
        rules.append(_rule("call", "%json", json.dumps(_schema(tools, form.key))))
    else:  # the name outside the JSON: one rule a tool, its arguments after its name
        rules.append(_rule("call", " | ".join(f"call{k}" for k in range(len(tools)))))
        for k, tool in enumerate(tools):
            head, tail = form.call(tool["function"]["name"])
            rules.append(_rule(f"call{k}", _lit(head), f"args{k}", _lit(tail)))
            rules.append(_rule(f"args{k}", "%json", json.dumps(_schema([tool], ""))))
    return _with_markers(rules)


# markers a model holds as one token (a control token or an added one): a grammar names that token (engine/constraint)
_MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|tool_call|>", DS_CALLS, DS_CALLS_END, DS_CALL,
            DS_CALL_END, DS_SEP, KEY, KEY_END, VALUE, VALUE_END)
_MARKER = re.compile("(" + "|".join(map(re.escape, _MARKERS)) + ")")
_CONTROL_NAMES = re.compile(r"\bcontrol_token_(\d+)")


def _with_markers(rules: list[str]) -> str:
    """The grammar of `rules` and of the markers they name."""
    used = sorted({int(k) for rule in rules for k in _CONTROL_NAMES.findall(rule)})
    return lark_grammar("\n".join(rules + control_rules((k, _MARKERS[k]) for k in used)), control_tokens=True)


def _rule(name: str, *parts: str) -> str:
    return f"{name}: " + " ".join(p for p in parts if p and p != '""')


def _schema(tools: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """A JSON call's schema ({"name", key}); key "": the arguments alone (one tool's)."""
    if not key:
        schema = tools[0]["function"].get("parameters") or _ANY_ARGUMENTS
    else:
        schema = {"anyOf": [{"type": "object", "required": ["name", key], "properties": {
            "name": {"const": t["function"]["name"]}, key: t["function"].get("parameters") or _ANY_ARGUMENTS}}
            for t in tools]}
    return _closed(schema)


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    return {**closed(schema), "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}


def _lit(text: str) -> str:
    """A grammar's text, its markers as their control-token rules."""
    pieces = _MARKER.split(text)  # text, marker, text, ...
    return " ".join(control_token(_MARKERS.index(p)) if k % 2 else json.dumps(p, ensure_ascii=False)
                    for k, p in enumerate(pieces) if p) or '""'


def _until(name: str, terminal: str, text: str) -> tuple[str, list[str]]:
    """(its name, its rules) of the lexeme `terminal` up to the first `text` (a marker's token where it is one)."""
    if text in _MARKERS:
        rule, line = control_until(_MARKERS.index(text), name, terminal, text)
        return rule, [line]
    return f"{name}_text", [f"{name}_text[lazy]: {terminal} {json.dumps(text, ensure_ascii=False)}"]


def parse_calls(fmt: str, text: str, names: Iterable[str] | Mapping[str, dict],
                limit: int | None = None) -> tuple[str, list[ToolCall]]:
    """An answer's text -> (its content, the tool calls it makes), as a CallStream fed it whole reads them. A call must
    name one of `names`; text that is not such a call stays content (a model that wrote something call-shaped but
    wrong is shown what it wrote rather than losing it). `limit`: the calls read at most (nothing after the last is
    read)."""
    stream = CallStream(fmt, names, limit)
    return joined(stream.feed(text) + stream.finish())


def joined(pieces: list[str | CallDelta]) -> tuple[str, list[ToolCall]]:
    """A stream's pieces -> (the content, the calls), as a client joins them."""
    content, names, arguments = [], [], []
    for piece in pieces:
        if isinstance(piece, str):
            content.append(piece)
        elif piece.name is not None:
            names.append(piece.name)
            arguments.append(piece.arguments)
        else:
            arguments[piece.index] += piece.arguments
    return "".join(content), [ToolCall(n, a) for n, a in zip(names, arguments)]


class CallStream:
    """An answer's content and calls as it streams: text goes out as content while no call may be under way; from
    where one may begin (its format's opener, or for the formats whose answer may be its calls alone the answer's
    first characters) the text is read as calls, each going out as soon as its name is known and then its arguments
    as they are written; text that turns out not to be calls goes out as content, and so does text after them."""

    def __init__(self, fmt: str, names: Iterable[str] | Mapping[str, dict], limit: int | None = None) -> None:
        """`names`: the tools' names, or each name's parameters schema (how Qwen's XML values are typed)."""
        self.form, self.limit = FORMATS[fmt], limit
        self._reader = self.form.reader() if self.form.reader else self.form.read
        self.names = names if isinstance(names, Mapping) else dict.fromkeys(names, {})
        self._held = ""  # text not sent yet, before any call
        self._section: str | None = None  # the text of the calls under way, from their opener
        self._gap = ""  # whitespace before the calls: content only if they turn out not to be calls
        self._base = 0  # the index of the section's first call
        self._sent: list[int] = []  # each call's arguments' characters sent
        self._tails: list[JsonTail] = []  # each call's arguments sent, read for where a string is open
        self._open: OpenString | None = None  # the arguments the section ends inside (feed's short way)
        self._pieces: list[str] = []  # the section's text fed since it was last read
        self._state = "start" if self.form.whole else "text"  # start: the answer may be its calls; free: plain text
        self._after_calls = False  # whitespace after calls is not content unless content comes before and after
        self._content = False  # content has gone out
        self.full = False  # the `limit`-th call has ended (or one past it began): nothing after it is read

    @property
    def called(self) -> bool:
        """Whether a call has gone out."""
        return bool(self._sent)

    def feed(self, text: str) -> list[str | CallDelta]:
        """The content (str) and call pieces of `text` that can go out now."""
        if self.full:
            return []
        if self._section is not None:
            if self._open is not None and (added := self._open.extend(text)) is not None:
                self._pieces.append(text)  # the section is not read again for a piece inside an open string
                self._sent[self._open.index] += len(added)
                return [CallDelta(self._open.index, None, added)] if added else []
            self._pieces.append(text)
        else:
            self._held += text
        out: list[str | CallDelta] = []
        self._advance(out, final=False)
        return out

    def finish(self) -> list[str | CallDelta]:
        """What is left once the answer has ended (by itself or cut short: a call under way stays as written)."""
        out: list[str | CallDelta] = []
        self._advance(out, final=True)
        return out

    def _advance(self, out: list, final: bool) -> None:
        if self._pieces:
            self._section += "".join(self._pieces)
            self._pieces.clear()
        self._open = None
        while not self.full and (self._section is not None and self._read(out, final)
                                 or self._section is None and self._text(out, final)):
            pass

    def _read(self, out: list, final: bool) -> bool:
        """Reads the calls under way; True where they ended (the text after is content again)."""
        section = self._reader(self._section, self.names)
        self._send_calls(section, out)
        if self.full:
            return False
        self._open = self._open_string(section)
        if section.bad is not None or final and not section.calls and section.end is None:
            self._not_calls(self._section[section.bad or 0:], section.bad or 0, out)
        elif section.end is not None:
            self._held, self._after_calls, self._state = self._section[section.end:], True, "text"
        elif not final:
            return False
        self._base += len(section.calls)
        self._section, self._gap = None, ""
        return True

    def _send_calls(self, section: Section, out: list) -> None:
        for k, (name, arguments) in enumerate(section.calls):
            index = self._base + k
            if self.limit is not None and index >= self.limit:
                self.full = True
                return
            if index == len(self._sent):
                out.append(CallDelta(index, name, ""))
                self._sent.append(0)
                self._tails.append(JsonTail())
            if piece := arguments[self._sent[index]:]:
                out.append(CallDelta(index, None, piece))
                self._sent[index] = len(arguments)
                self._tails[index].update(piece)
        if self.limit is not None and self._base + section.done >= self.limit:
            self.full = True  # the last call allowed has ended: nothing after it is read (the server stops there)

    def _open_string(self, section: Section) -> OpenString | None:
        """The string the section's text ends in, inside its last call's arguments (all sent), with nothing held back
        that may begin a closing tag (or a value that is not text, of which nothing goes out before its tag); or, where
        the arguments are the model's JSON, their open object; None where there is none."""
        index = self._base + len(section.calls) - 1
        if section.end is not None or section.bad is not None or not section.calls or index >= len(self._tails):
            return None
        tail = self._tails[index]
        if not self.form.closers:
            return OpenString(index, tail, ()) if tail.depth > 0 else None
        if not (tail.in_string or section.quiet) or partial_suffix(self._section, self.form.closers):
            return None
        return OpenString(index, tail, self.form.closers, quiet=section.quiet)

    def _not_calls(self, text: str, at: int, out: list) -> None:
        """`text` (from `at` in the section) is content: an answer that did not begin with its calls is plain text;
        else the opener goes out at once and the rest is read again as text."""
        if self._state == "start" and at == 0:
            self._put(text, out)
            self._held, self._state = "", "free"
            return
        skipped = opened(text, self.form.openers)
        self._put(self._gap + text[:skipped], out)
        self._held, self._state = text[skipped:], "text"

    def _text(self, out: list, final: bool) -> bool:
        """Sends the held text's content; True where calls begin in it."""
        if self._state == "start":
            head, openers = self._held.lstrip(), self.form.openers
            opener = any(o.startswith(head) or head.startswith(o) for o in openers)  # read as text: calls after it
            partial = any(o.startswith(head) and len(head) < len(o) for o in openers)
            decided = None if partial else False if opener else self.form.whole(head, self.names)
            if decided is None and not final:
                return False
            self._state = "text"
            if decided:
                self._section, self._held = self._held, ""
                self._state = "start"  # until the calls are read: their not being calls makes the rest plain text
                return True
        if self._after_calls and self._held.strip():  # text after calls: apart from the content before, if any
            self._after_calls = False
            self._held = self._held if self._content else self._held.lstrip()
        at = min((i for i in (self._held.find(o) for o in self.form.openers) if i >= 0), default=-1)
        if self._state != "free" and at >= 0:
            before = self._held[:at].rstrip()
            self._put(before, out)
            self._gap, self._section, self._held = self._held[len(before):at], self._held[at:], ""
            return True
        if final:  # whitespace at the end of an answer with calls is not content
            self._put(self._held.rstrip() if self.called else self._held, out)
            self._held = ""
            return False
        keep = partial_suffix(self._held, self.form.openers) if self._state != "free" else 0
        send = self._held[:len(self._held) - keep].rstrip()
        self._put(send, out)
        self._held = self._held[len(send):]
        return False

    def _put(self, text: str, out: list) -> None:
        if text:
            out.append(text)
            self._content = True


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
