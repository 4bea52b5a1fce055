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
                schema: Callable[[dict], dict]) -> list[str]:
    """Lark rules of one call (or more, `parallel`) to one of `tools`: each parameter in its schema's order, required
    ones always; a string's value any text up to its closing tag (as long as its maxLength allows; a string enum one
    of its values; a pattern is not held), any other value JSON following its schema. `lit`, `schema`: tool_calls' literal and JSON-schema writers."""
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
            rules += _parameter_rules(rule, key, sub or {}, lit, schema)
        head = lit(f"<tool_call>\n{FUNCTION}{function['name']}>\n")
        rules.append(f"call{k}: {head} {' '.join(parts)} {lit(FUNCTION_END + chr(10) + '</tool_call>')}")
    return rules


def _parameter_rules(rule: str, key: str, sub: dict, lit: Callable[[str], str],
                     schema: Callable[[dict], dict]) -> list[str]:
    head = lit(f"{PARAMETER}{key}>\n")
    if "enum" in sub and _is_text(sub):
        values = " | ".join(json.dumps(v, ensure_ascii=False) for v in sub["enum"])  # a value's text, markers too
        return [f"{rule}: {head} ({values}) {lit(_VALUE_END + chr(10))}"]
    if _is_text(sub):  # lazy: the text ends at the first closing tag; its length bounded as the schema bounds it
        length = f"{{{int(sub.get('minLength', 0))},{sub['maxLength']}}}" if "maxLength" in sub else "*"
        return [f"{rule}: {head} {rule}_text {lit(chr(10))}",
                f"{rule}_text[lazy]: /(?s:.{length})\\n<\\/parameter>/"]
    return [f"{rule}: {head} {rule}_json {lit(_VALUE_END + chr(10))}", f"{rule}_json: %json {json.dumps(schema(sub))}"]
