"""Qwen3-Coder's and Qwen3.5's XML tool calls: the reader and the grammar. A call is
`<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n…</function>\n</tool_call>`, a value written as
text: a string as it is, anything else as JSON (Python's spelling of a boolean too). The arguments sent are JSON, each
value typed by the tool's schema; a string streams as it is written, any other value once it has ended."""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from engine.tokenizer.detokenizer import partial_suffix
from engine.tool_formats import NAME, Bad, skip

FUNCTION, PARAMETER = "<function=", "<parameter="
FUNCTION_END, PARAMETER_END = "</function>", "</parameter>"
_VALUE_END = "\n" + PARAMETER_END  # the template writes a newline before the closing tag


def xml_call(text: str, i: int, tools: Mapping[str, dict]) -> tuple[tuple[str, str] | None, int | None]:
    """The call at text[i] (after `<tool_call>`): the call once its name is known, its arguments' JSON so far, and the
    index after `</function>` (None while it goes on; where the text stopped being the call's once it was named)."""
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
    properties = (tools[name] or {}).get("properties") or {}
    pairs, j = [], close + 1
    while True:
        j = skip(text, j)
        if text.startswith(FUNCTION_END, j):
            return (name, "{" + ", ".join(pairs) + "}"), j + len(FUNCTION_END)
        head = "{" + ", ".join(pairs)
        if j >= len(text) or any(tag.startswith(text[j:]) for tag in (FUNCTION_END, PARAMETER)):
            return (name, head), None
        if not text.startswith(PARAMETER, j):  # not a parameter: the call ended there
            return (name, head + "}"), j
        pair, j = _parameter(text, j, properties)
        if j is None:
            return (name, head + (", " if pairs and pair else "") + pair), None
        pairs.append(pair)


def _parameter(text: str, j: int, properties: dict) -> tuple[str, int | None]:
    """A parameter's `"key": value` JSON, and the index after its closing tag; while it goes on, what of it is
    certain (a string's characters so far, not a tail that may begin its closing tag) and None."""
    close = text.find(">", j)
    if close < 0 or close + 1 >= len(text):  # the key, or whether a newline opens the value, still to come
        return "", None
    key = text[j + len(PARAMETER):close]
    is_text = _is_text(properties.get(key) or {})
    start = close + 1 + text.startswith("\n", close + 1)
    end = text.find(PARAMETER_END, close + 1)
    if end < 0:
        value = text[start:]
        value = value[:len(value) - partial_suffix(value, (_VALUE_END, PARAMETER_END))]
        return (f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)[:-1]}" if is_text else ""), None
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


def xml_grammar(tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str],
                schema: Callable[[dict], dict], until: Callable[[str, str, str], tuple[str, str]]) -> list[str]:
    """Lark rules of one call (or more, `parallel`) to one of `tools`: each parameter in its schema's order, required
    ones always; a string's value any text up to its closing tag (as long as its maxLength allows; a string enum one
    of its values; a pattern is not held), any other value JSON following its schema. `lit`, `schema`, `until`:
    tool_calls' writers of a literal, a JSON schema and text up to a closing text."""
    rules = ['start: call ("\\n" call)*' if parallel else "start: call",
             "call: " + " | ".join(f"call{k}" for k in range(len(tools)))]
    for k, tool in enumerate(tools):
        function = tool["function"]
        parameters = function.get("parameters") or {}
        required = set(parameters.get("required") or ())
        parts = []
        for n, (key, sub) in enumerate((parameters.get("properties") or {}).items()):
            rule = f"p{k}_{n}"
            parts.append(rule if key in required else f"{rule}?")
            rules += _parameter_rules(rule, key, sub or {}, lit, schema, until)
        head = lit(f"<tool_call>\n{FUNCTION}{function['name']}>\n")
        rules.append(f"call{k}: {head} {' '.join(parts)} {lit(FUNCTION_END + chr(10) + '</tool_call>')}")
    return rules


def _parameter_rules(rule: str, key: str, sub: dict, lit: Callable[[str], str], schema: Callable[[dict], dict],
                     until: Callable[[str, str, str], tuple[str, str]]) -> list[str]:
    head = lit(f"{PARAMETER}{key}>\n")
    if "enum" in sub and _is_text(sub):
        values = " | ".join(json.dumps(v, ensure_ascii=False) for v in sub["enum"])  # a value's text, markers too
        return [f"{rule}: {head} ({values}) {lit(_VALUE_END + chr(10))}"]
    if _is_text(sub):  # lazy: the text ends at the first closing tag; its length bounded as the schema bounds it
        name, text = until(rule, f"(?s:.{_length(sub)})", _VALUE_END)
        return [f"{rule}: {head} {name} {lit(chr(10))}", text]
    return [f"{rule}: {head} {rule}_json {lit(_VALUE_END + chr(10))}", f"{rule}_json: %json {json.dumps(schema(sub))}"]


# -- GLM-4.5 / 4.6: `<tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n…</tool_call>`
KEY, KEY_END, VALUE, VALUE_END, CALL_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "</tool_call>"


def glm_call(text: str, i: int, tools: Mapping[str, dict]) -> tuple[tuple[str, str] | None, int | None]:
    """The call at text[i] (after `<tool_call>`): the call once its name is known, its arguments' JSON so far, and the
    index of its `</tool_call>` (None while it goes on; where the text stopped being the call's once it was named)."""
    found = NAME.match(text, i)
    j = found.end() if found else i
    if j >= len(text):
        if found and not any(n.startswith(found.group()) for n in tools):
            raise Bad
        return None, None
    if not found or found.group() not in tools:
        raise Bad
    name, properties = found.group(), (tools[found.group()] or {}).get("properties") or {}
    pairs: list[str] = []
    while True:
        j = skip(text, j)
        head = "{" + ", ".join(pairs)
        if text.startswith(CALL_END, j):
            return (name, head + "}"), j
        if j >= len(text) or any(tag.startswith(text[j:]) for tag in (CALL_END, KEY)):
            return (name, head), None
        if not text.startswith(KEY, j):  # not an argument: the call ended there
            return (name, head + "}"), j
        pair, end = _glm_pair(text, j, properties)
        if end is None:
            return (name, head + (", " if pairs and pair else "") + pair), None
        if end < 0:
            return (name, head + "}"), j
        pairs.append(pair)
        j = end


def _glm_pair(text: str, j: int, properties: dict) -> tuple[str, int | None]:
    """The argument at text[j] == `<arg_key>`: its `"key": value` JSON and the index after `</arg_value>`; while it goes
    on, what of it is certain (a string's characters so far) and None; -1 where it is no argument."""
    key_end = text.find(KEY_END, j)
    at = skip(text, key_end + len(KEY_END)) if key_end >= 0 else len(text)
    if at >= len(text) or not text.startswith(VALUE, at) and VALUE.startswith(text[at:]):
        return "", None
    if not text.startswith(VALUE, at):
        return "", -1
    key, start = text[j + len(KEY):key_end], at + len(VALUE)
    is_text = _is_text(properties.get(key) or {})
    end = text.find(VALUE_END, start)
    if end < 0:
        value = text[start:]
        value = value[:len(value) - partial_suffix(value, (VALUE_END,))]
        return (f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)[:-1]}" if is_text else ""), None
    return f"{json.dumps(key)}: {_typed(text[start:end], is_text)}", end + len(VALUE_END)


def glm_grammar(tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str],
                schema: Callable[[dict], dict], until: Callable[[str, str, str], tuple[str, str]]) -> list[str]:
    """Lark rules of one GLM call (or more, `parallel`) to one of `tools`, each argument in its schema's order,
    required ones always: a string's value any text up to `</arg_value>` (within its maxLength; a string enum one of
    its values), any other value JSON following its schema. `until`: text up to a marker (tool_calls' writer)."""
    rules = ['start: call ("\\n" call)*' if parallel else "start: call",
             "call: " + " | ".join(f"call{k}" for k in range(len(tools)))]
    for k, tool in enumerate(tools):
        function = tool["function"]
        parameters = function.get("parameters") or {}
        required = set(parameters.get("required") or ())
        parts = []
        for n, (key, sub) in enumerate((parameters.get("properties") or {}).items()):
            rule, sub = f"p{k}_{n}", sub or {}
            parts.append(rule if key in required else f"{rule}?")
            head = lit(f"{KEY}{key}{KEY_END}\n{VALUE}")
            if "enum" in sub and _is_text(sub):
                values = " | ".join(json.dumps(v, ensure_ascii=False) for v in sub["enum"])
                rules.append(f"{rule}: {head} ({values}) {lit(VALUE_END)} {lit(chr(10))}")
            elif _is_text(sub):
                name, text = until(rule, f"(?s:.{_length(sub)})", VALUE_END)
                rules += [f"{rule}: {head} {name} {lit(chr(10))}", text]
            else:
                rules += [f"{rule}: {head} {rule}_json {lit(VALUE_END)} {lit(chr(10))}",
                          f"{rule}_json: %json {json.dumps(schema(sub))}"]
        rules.append(f"call{k}: {lit('<tool_call>' + function['name'] + chr(10))} {' '.join(parts)} {lit(CALL_END)}")
    return rules


def _length(sub: dict) -> str:
    """A string's length as a regex repeats a character: its schema's bounds."""
    return f"{{{int(sub.get('minLength', 0))},{sub['maxLength']}}}" if "maxLength" in sub else "*"
