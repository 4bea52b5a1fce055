"""Grammars a turn may ask its answer to follow, in llguidance's grammar text (SamplingParams.grammar carries it)."""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable

from llguidance import LLMatcher

from engine.errors import ParleyError
from engine.sampling import MAX_GRAMMAR_CHARS
# between JSON tokens: one space, or a line break and an indent (llama.cpp's rule): pretty-printed JSON passes, and a
# weak model cannot pad its answer with blank lines until max_tokens (llguidance's default allows any whitespace)
JSON_WHITESPACE = r"[ ]?|\n[ \t]{0,20}"
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def json_grammar(schema: dict[str, Any] | None = None) -> str:
    """A grammar for one JSON value following `schema` (None: any JSON object, OpenAI's `json_object`)."""
    if schema is not None and not isinstance(schema, dict):
        raise ParleyError("Invalid response format: a JSON schema must be a JSON object.")
    try:
        grammar = LLMatcher.grammar_from_json_schema(_ANY_OBJECT if schema is None else closed(schema),
                                                     defaults={"whitespace_pattern": JSON_WHITESPACE})
    except (ValueError, TypeError) as exc:
        raise ParleyError(f"Invalid JSON schema: {_message(exc)}") from None
    return checked(grammar, "JSON schema")  # llguidance names the part of the schema it cannot compile


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_SCHEMA_KEYS = ("items", "prefixItems", "anyOf", "oneOf", "allOf", "not", "if", "then", "else", "contains",
                "additionalProperties", "unevaluatedProperties", "additionalItems", "propertyNames")  # schema(s)


LARGEST = 10**15 - 1  # a number's bound where its schema sets none: 15 digits (a double's exact integers reach 9e15)


def closed(schema: Any) -> Any:
    """The schema as a model can finish it, a copy:
    - every object that lists its properties takes no others unless it says so, as llama.cpp's converter and
      xgrammar's strict mode read it (JSON Schema's default, any others, let a small model add keys until max_tokens);
      objects without listed properties stay open ({"type": "object"} is any object);
    - a number or integer with no bound on a side is bounded there at ±LARGEST, as llama.cpp's grammar caps the digits
      (the embedded model, greedy, wrote "population": 1000… to max_tokens)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema  # true / false schemas
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_KEYS:
        if key in out:
            out[key] = closed(out[key])
    lists_own = isinstance(out.get("properties"), dict) and "patternProperties" not in out
    if lists_own and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    if out.get("type") in ("number", "integer"):
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -LARGEST
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = LARGEST
    return out


def regex_grammar(pattern: str) -> str:
    """A grammar for text matching `pattern` whole (Rust regex syntax, as llguidance reads it)."""
    return checked(LLMatcher.grammar_from_regex(pattern), "regex")


def lark_grammar(source: str, control_tokens: bool = False) -> str:
    """A grammar from Lark text (llguidance's dialect: `start: ...`, regex terminals, %json { schema }).
    `control_tokens`: its control-token rules are the engine's own (a tool call's markers); a user's grammar may not
    define rules of those names, which `with_control_tokens` would turn into a token of the model's."""
    reserved = None if control_tokens else _RESERVED.search(source)
    if reserved:
        raise ParleyError(f"Invalid grammar: the rule name {reserved.group(1)!r} is reserved (rules named "
                          "control_token_<number>... stand for a model's control tokens); rename it.")
    return checked(LLMatcher.grammar_from_lark(source), "grammar")


# a rule `control_token_<k>: "<text>"` is text a model may hold as one token of its vocabulary (a tool call's marker),
# and `control_token_<k>_until_<name>[lazy]: <TERMINAL> "<text>"` a lexeme up to it: the grammar is written without
# the tokenizer, and Grammars names the token where the model has one
_STRING = r'"(?:[^"\\\n]|\\.)*"'
_CONTROL = re.compile(rf"^(control_token_\d+): ({_STRING})$", re.M)
_UNTIL = re.compile(rf"^((control_token_\d+)_until_\w+)\[lazy\]: ([A-Z0-9_]+) {_STRING}$", re.M)
_RESERVED = re.compile(r"^\s*[?!]?(control_token_\d+\w*)", re.M)  # a rule defined under such a name


def control_token(k: int) -> str:
    """The name of the grammar's k-th control-token rule (written by `control_rules`)."""
    return f"control_token_{k}"


def control_rules(texts: Iterable[tuple[int, str]]) -> list[str]:
    """Lark rules for (k, text): the text, until `with_control_tokens` names its token."""
    return [f"{control_token(k)}: {json.dumps(text, ensure_ascii=False)}" for k, text in texts]


def control_until(k: int, name: str, terminal: str, text: str) -> tuple[str, str]:
    """(its name, the rule) of the lexeme `terminal` up to the first `text`, the k-th control token's, which ends it
    (where the model holds `text` as one token: `terminal`, greedy, then that token)."""
    rule = f"{control_token(k)}_until_{name}"
    return rule, f"{rule}[lazy]: {terminal} {json.dumps(text, ensure_ascii=False)}"


def with_control_tokens(grammar: str, token_id: Callable[[str], int | None]) -> str:
    """`grammar` with each control-token rule naming the model's token of its text (`<[id]>`) where `token_id` finds
    the text as one token: llguidance matches a grammar's text against ordinary tokens only, so a marker the model
    was trained to write as one control token (Mistral's [TOOL_CALLS]) would have to be spelled out of pieces it never
    wrote. Elsewhere the rule stays the text."""
    texts = {m.group(1): json.loads(m.group(2)) for m in _CONTROL.finditer(grammar)}
    ids = {rule: token_id(text) for rule, text in texts.items()}

    def named(m: re.Match) -> str:
        return m.group(0) if ids[m.group(1)] is None else f"{m.group(1)}: <[{ids[m.group(1)]}]>"

    def until(m: re.Match) -> str:  # a lexeme cannot hold a token: the text before it greedy, then the token
        rule, marker, terminal = m.groups()
        return m.group(0) if ids.get(marker) is None else f"{rule}: {terminal} {marker}"

    return _UNTIL.sub(until, _CONTROL.sub(named, grammar))


def checked(grammar: str, what: str = "grammar") -> str:
    """The grammar, if llguidance compiles it; else a ParleyError naming `what` with llguidance's message."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise ParleyError(f"Invalid {what}: longer than {MAX_GRAMMAR_CHARS:,} characters.")
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise ParleyError(f"Invalid {what}: {_message(error)}")
    return grammar


def schema_from_text(text: str) -> dict[str, Any]:
    """A JSON schema read from text (a file or a flag), with the JSON error's place when it is not one."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParleyError(f"Invalid JSON schema: {exc}") from None
    if not isinstance(schema, dict):
        raise ParleyError("Invalid JSON schema: it must be a JSON object.")
    return schema


def _message(error: object) -> str:
    """llguidance's message on one line, cut short (a regex error spans lines: its first says only that it is one)."""
    text = " ".join(line.strip() for line in str(error).strip().splitlines() if line.strip())
    return (text or "unknown error")[:300]
