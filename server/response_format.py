"""`response_format`: an answer held to JSON (any object, or a schema), as OpenAI's structured outputs ask for it.

{"type": "text"} (or none) is free text; {"type": "json_object"} any JSON object (with llama.cpp's extension, a
"schema" beside it); {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}} JSON
that follows the schema. Each becomes a grammar the engine masks every token with (engine/constraint)."""
from __future__ import annotations

from typing import Any

from engine.constraint.grammar import json_grammar
from engine.errors import ParleyError
from server.api_error import APIError

FIELD = "response_format"


def response_grammar(data: dict) -> str | None:
    """The request's grammar, or None for free text; an APIError naming the field for anything else."""
    fmt = data.get(FIELD)
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise APIError(400, f"'{FIELD}' must be an object such as {{\"type\": \"json_object\"}}.", FIELD)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return _compiled(_schema(fmt, "schema", required=False))
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise APIError(400, f"'{FIELD}.json_schema' must be an object holding the 'schema'.", FIELD)
        return _compiled(_schema(spec, "schema", required=True, where=f"{FIELD}.json_schema"))
    raise APIError(400, f"'{FIELD}.type' must be 'text', 'json_object' or 'json_schema', not {kind!r}.", FIELD)


def _schema(holder: dict, key: str, required: bool, where: str = FIELD) -> dict[str, Any] | None:
    schema = holder.get(key)
    if schema is None and not required:
        return None
    if not isinstance(schema, dict):
        raise APIError(400, f"'{where}.{key}' must be a JSON schema (an object).", FIELD)
    return schema


def _compiled(schema: dict[str, Any] | None) -> str:
    try:
        return json_grammar(schema)
    except ParleyError as exc:  # llguidance's message names what it cannot compile
        raise APIError(400, str(exc), FIELD) from None
