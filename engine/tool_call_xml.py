"""Tool calls whose arguments are tags and values written as text, their readers and their grammar: Qwen3-Coder's and
Qwen3.5's `<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n…</function>\n</tool_call>`, and
GLM-4.5's `<tool_call>name\n<arg_key>key</arg_key>\n<arg_value>value</arg_value>\n…</tool_call>`. A value is a string
as it is, anything else JSON (Python's spelling of a boolean too). The arguments sent are JSON, each value typed by the
tool's schema; a string streams as it is written, any other value once it has ended."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

from engine.errors import ParleyError
from engine.tokenizer.detokenizer import partial_suffix
from engine.tool_formats import NAME, Bad, Reader, Section, block_section, skip

FUNCTION, PARAMETER = "<function=", "<parameter="
FUNCTION_END, PARAMETER_END = "</function>", "</parameter>"
_VALUE_END = "\n" + PARAMETER_END  # the template writes a newline before the closing tag
XML_VALUE_ENDS = (_VALUE_END, PARAMETER_END)  # what ends a value (engine/tool_string_tail.py)


@dataclass(slots=True)
class Resume:
    """A stream's memory of the call it reads: the text read last, where the call's arguments begin, the index after
    their last whole argument and the JSON of the arguments up to it. While a call streams its text only grows and a
    whole argument never changes, so the next read begins there (read from the call's start at each piece, a call of
    1,000 short arguments took 29 s in 4-character pieces)."""

    text: str = ""
    start: int = -1  # -1: nothing read
    end: int = 0
    pairs: str = ""  # the whole arguments' `"key": value` JSON, joined by ", "
    quiet: bool = False  # the last read ended inside a value that is not text (Section.quiet)

    def at(self, text: str, start: int) -> Resume:
        """Itself where `text` grew from the text it read and the arguments begin at `start`; else reset there."""
        if start != self.start or not text.startswith(self.text):
            self.start, self.end, self.pairs = start, start, ""
        self.text = text
        return self


def xml_reader() -> Reader:
    """A reader of Qwen XML calls for one stream: each read resumes after the arguments read whole (`Resume`)."""
    return _resumed(xml_call)


def glm_reader() -> Reader:
    """A reader of GLM calls for one stream: each read resumes after the arguments read whole (`Resume`)."""
    return _resumed(glm_call)


def _resumed(call: Callable[..., tuple[tuple[str, str] | None, int | None]]) -> Reader:
    """A block reader of `call` with one `Resume` for the stream, its sections marked `quiet` where they end inside a
    value that is not text."""
    resume = Resume()
    read = block_section(partial(call, resume=resume))

    def reader(text: str, names: Mapping[str, dict]) -> Section:
        resume.quiet = False  # a read that stops before the arguments (a new call's name) leaves it unset
        section = read(text, names)
        section.quiet = resume.quiet and section.end is None and section.bad is None
        return section
    return reader


def xml_call(text: str, i: int, tools: Mapping[str, dict],
             resume: Resume | None = None) -> tuple[tuple[str, str] | None, int | None]:
    """The call at text[i] (after `<tool_call>`): the call once its name is known, its arguments' JSON so far, and the
    index after `</function>` (None while it goes on; where the text stopped being the call's once it was named).
    `resume`: what an earlier read of the same call, its text shorter, read of it."""
    if not text.startswith(FUNCTION, i):
        if FUNCTION.startswith(text[i:]):
            return None, None
        raise Bad
    close = text.find(">", i)
    name = text[i + len(FUNCTION):close if close >= 0 else len(text)]
    if name and not NAME.fullmatch(name) or close >= 0 and name not in tools:
        raise Bad
    if close < 0:
        return None, None
    call, end = _arguments_at(text, close + 1, name, tools, (PARAMETER, FUNCTION_END), _parameter, resume)
    return call, end + len(FUNCTION_END) if end is not None and text.startswith(FUNCTION_END, end) else end


def _arguments_at(text: str, j: int, name: str, tools: Mapping[str, dict], tags: tuple[str, str],
                  one: Callable[..., tuple[str, int | None]],
                  resume: Resume | None) -> tuple[tuple[str, str], int | None]:
    """The call's arguments from j, each read by `one` from its opening tag (tags[0]) on, and where they ended: at the
    call's closing tag (tags[1]) or where the text stopped being arguments (None while they go on). Read from where
    `resume` read whole arguments up to (the pairs joined as read: joined at each read, 1,000 were quadratic)."""
    parameters, read = tools[name] or {}, (resume or Resume()).at(text, j)
    listed, others = parameters.get("properties") or {}, _others(parameters) or {}

    def schema_of(key: str) -> dict:  # how its value is typed: a listed argument's schema, else the others'
        return (listed[key] or {}) if key in listed else others

    j = read.end
    while True:
        j = skip(text, j)
        if text.startswith(tags[1], j):
            return (name, "{" + read.pairs + "}"), j
        if j >= len(text) or any(tag.startswith(text[j:]) for tag in tags):
            return (name, "{" + read.pairs), None
        if not text.startswith(tags[0], j):  # not an argument: the call ended there
            return (name, "{" + read.pairs + "}"), j
        pair, end = one(text, j, schema_of)
        if end is None:
            read.quiet = pair is None
            return (name, "{" + _joined(read.pairs, pair or "")), None
        if end < 0:
            return (name, "{" + read.pairs + "}"), j
        read.pairs, read.end = _joined(read.pairs, pair), end
        j = end


def _joined(pairs: str, pair: str) -> str:
    return f"{pairs}, {pair}" if pairs and pair else pairs or pair


def _parameter(text: str, j: int, schema_of: Callable[[str], dict]) -> tuple[str | None, int | None]:
    """A parameter's `"key": value` JSON, and the index after its closing tag; while it goes on, what of it is
    certain (a string's characters so far, not a tail that may begin its closing tag; None inside a value that is not
    text: nothing until it ends) and None."""
    close = text.find(">", j)
    if close < 0 or close + 1 >= len(text):  # the key, or whether a newline opens the value, still to come
        return "", None
    key = text[j + len(PARAMETER):close]
    is_text = _is_text(schema_of(key))
    start = close + 1 + text.startswith("\n", close + 1)
    end = text.find(PARAMETER_END, close + 1)
    if end < 0:
        value = text[start:]
        value = value[:len(value) - partial_suffix(value, (_VALUE_END, PARAMETER_END))]
        return (f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)[:-1]}" if is_text else None), None
    value = text[start:end] if end >= start else ""
    value = value[:-1] if value.endswith("\n") else value
    return f"{json.dumps(key)}: {_typed(value, is_text)}", end + len(PARAMETER_END)


def _is_text(schema: dict) -> bool:
    return schema.get("type") == "string" or "enum" in schema and all(isinstance(v, str) for v in schema["enum"])


def _typed(value: str, is_text: bool) -> str:
    """A value's JSON: a string's as it is; any other value's as JSON where it is (True/False as Python writes them)."""
    if not is_text:
        try:
            return json.dumps(json.loads({"True": "true", "False": "false", "None": "null"}.get(value, value)),
                              ensure_ascii=False)
        except ValueError:
            pass
    return json.dumps(value, ensure_ascii=False)


# -- GLM-4.5 / 4.6: `<tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n…</tool_call>`
KEY, KEY_END, VALUE, VALUE_END, CALL_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "</tool_call>"
GLM_VALUE_ENDS = (VALUE_END,)


def glm_call(text: str, i: int, tools: Mapping[str, dict],
             resume: Resume | None = None) -> tuple[tuple[str, str] | None, int | None]:
    """The call at text[i] (after `<tool_call>`): the call once its name is known, its arguments' JSON so far, and the
    index of its `</tool_call>` (None while it goes on; where the text stopped being the call's once it was named).
    `resume`: what an earlier read of the same call, its text shorter, read of it."""
    found = NAME.match(text, i)
    j = found.end() if found else i
    if j >= len(text):
        if found and not any(n.startswith(found.group()) for n in tools):
            raise Bad
        return None, None
    if not found or found.group() not in tools:
        raise Bad
    return _arguments_at(text, j, found.group(), tools, (KEY, CALL_END), _glm_pair, resume)


def _glm_pair(text: str, j: int, schema_of: Callable[[str], dict]) -> tuple[str | None, int | None]:
    """The argument at text[j] == `<arg_key>`: its `"key": value` JSON and the index after `</arg_value>`; while it goes
    on, what of it is certain (a string's characters so far; None inside a value that is not text) and None; -1 where
    it is no argument."""
    key_end = text.find(KEY_END, j)
    at = skip(text, key_end + len(KEY_END)) if key_end >= 0 else len(text)
    if at >= len(text) or not text.startswith(VALUE, at) and VALUE.startswith(text[at:]):
        return "", None
    if not text.startswith(VALUE, at):
        return "", -1
    key, start = text[j + len(KEY):key_end], at + len(VALUE)
    is_text = _is_text(schema_of(key))
    end = text.find(VALUE_END, start)
    if end < 0:
        value = text[start:]
        value = value[:len(value) - partial_suffix(value, (VALUE_END,))]
        return (f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)[:-1]}" if is_text else None), None
    return f"{json.dumps(key)}: {_typed(text[start:end], is_text)}", end + len(VALUE_END)


# -- grammars: each argument a tag and its value as text
@dataclass(frozen=True, slots=True)
class Writers:
    """tool_calls' writers of a grammar's literal text, of a JSON schema, and of text up to a closing text (the rule's
    name and its rules; `terminal`: the text's lexeme)."""

    lit: Callable[[str], str]
    schema: Callable[[dict], dict]
    until: Callable[[str, str, str], tuple[str, list[str]]]


@dataclass(frozen=True, slots=True)
class _Tags:
    call_open: str  # before the tool's name
    name_close: str  # after it
    call_close: str
    key_open: str  # before an argument's key
    key_close: str  # between the key and the value
    value_close: str


_XML = _Tags("<tool_call>\n" + FUNCTION, ">\n", FUNCTION_END + "\n</tool_call>", PARAMETER, ">\n", _VALUE_END)
_GLM = _Tags("<tool_call>", "\n", "</tool_call>", "<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>")
_FREE_KEY = "FREE_KEY: /[^<>\\n]+/"  # an argument the schema does not list, where it allows others


def xml_grammar(tools: list[dict[str, Any]], parallel: bool, w: Writers) -> list[str]:
    """Lark rules of one Qwen XML call (or more, `parallel`) to one of `tools` (`_tag_grammar`)."""
    return _tag_grammar(_XML, tools, parallel, w)


def glm_grammar(tools: list[dict[str, Any]], parallel: bool, w: Writers) -> list[str]:
    """Lark rules of one GLM call (or more, `parallel`) to one of `tools` (`_tag_grammar`)."""
    return _tag_grammar(_GLM, tools, parallel, w)


def _tag_grammar(tags: _Tags, tools: list[dict[str, Any]], parallel: bool, w: Writers) -> list[str]:
    """Each listed argument in its schema's order, required ones always, then (where the schema allows others) any
    more: a string's value any text up to its closing tag within its minLength, maxLength and pattern, a string enum
    one of its values, any other value JSON following its schema."""
    rules = ['start: call ("\\n" call)*' if parallel else "start: call", _FREE_KEY,
             "call: " + " | ".join(f"call{k}" for k in range(len(tools)))]
    for k, tool in enumerate(tools):
        function = tool["function"]
        parts = []
        for n, (key, sub, required) in enumerate(_arguments(function)):
            rule = f"p{k}_{n}"
            parts.append(rule if required else f"{rule}?")
            rules += _value_rules(tags, rule, w.lit(f"{tags.key_open}{key}{tags.key_close}"), sub, w)
        extra = _others(function.get("parameters") or {})
        if extra is not None:
            head = f"{w.lit(tags.key_open)} FREE_KEY {w.lit(tags.key_close)}"
            parts.append(f"x{k}*")
            rules += _value_rules(tags, f"x{k}", head, extra, w)
        head = w.lit(f"{tags.call_open}{function['name']}{tags.name_close}")
        rules.append(f"call{k}: {head} {' '.join(parts)} {w.lit(tags.call_close)}")
    return rules


def _arguments(function: dict) -> list[tuple[str, dict, bool]]:
    """(key, schema, required) of each argument the grammar names: the listed ones, then required ones it does not
    list where the schema allows others (a ParleyError where it does not: no call could follow it)."""
    parameters = function.get("parameters") or {}
    listed, required = parameters.get("properties") or {}, list(parameters.get("required") or ())
    out = [(key, sub or {}, key in required) for key, sub in listed.items()]
    unlisted = [key for key in required if key not in listed]
    if unlisted and _others(parameters) is None:
        raise ParleyError(f"Tool {function['name']!r} requires {unlisted[0]!r}, which its parameters neither list "
                          "nor allow (additionalProperties is false).")
    return out + [(key, _others(parameters), True) for key in unlisted]


def _others(parameters: dict) -> dict | None:
    """The schema of an argument the parameters do not list, None where they allow none (as tool_calls' closed()
    reads a schema: listed properties and nothing else unless it says so)."""
    extra = parameters.get("additionalProperties", None if parameters.get("properties") else True)
    return None if extra is False or extra is None else extra if isinstance(extra, dict) else {}


def _value_rules(tags: _Tags, rule: str, head: str, sub: dict, w: Writers) -> list[str]:
    if "enum" in sub and _is_text(sub):
        values = " | ".join(json.dumps(v, ensure_ascii=False) for v in sub["enum"])  # a value's text, markers too
        return [f"{rule}: {head} ({values}) {w.lit(tags.value_close)} {w.lit(chr(10))}"]
    if _is_text(sub) or not sub:  # the text up to its closing tag (any text where the schema says nothing)
        terminal = f"{rule.upper()}_TEXT"
        name, text = w.until(rule, terminal, tags.value_close)
        return [f"{rule}: {head} {name} {w.lit(chr(10))}", f"{terminal}: {_string_regex(sub)}", *text]
    return [f"{rule}: {head} {rule}_json {w.lit(tags.value_close)} {w.lit(chr(10))}",
            f"{rule}_json: %json {json.dumps(w.schema(sub))}"]


def _string_regex(sub: dict) -> str:
    """A string value's lexeme: its length as its schema bounds it, and its pattern (found anywhere in it, as JSON
    Schema reads one; ^ and $ at its ends anchor it)."""
    low, high = int(sub.get("minLength", 0)), sub.get("maxLength")
    length = f"/(?s:.{{{low},{high if high is not None else ''}}})/" if low or high is not None else "/(?s:.*)/"
    pattern = sub.get("pattern")
    if not isinstance(pattern, str):
        return length
    head = "" if pattern.startswith("^") else "(?s:.*)"
    body = pattern.removeprefix("^")
    tail = "" if body.endswith("$") and not body.endswith("\\$") else "(?s:.*)"
    body = body.removesuffix("$") if not tail else body
    body = re.sub(r"(?<!\\)/", r"\/", body).replace("\n", "\\n")
    return f"{length} & /{head}(?:{body}){tail}/"
