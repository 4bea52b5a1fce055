"""/v1/completions' `prompt` in OpenAI's four forms: a string, an array of strings, an array of token ids, or an array
of arrays of token ids. Each prompt of an array is answered on its own, as vLLM's and OpenAI's servers do."""
from __future__ import annotations

import json

from server.api_error import APIError

Prompt = str | tuple[int, ...]  # a text document, or one as token ids (sent to the model as they are)
FORMS = "a string, an array of strings, an array of token ids or an array of arrays of token ids"
MAX_ANSWERS = 2048  # prompts x best_of: each answer is a session, queued for a slot


def completion_prompts(value, context: int) -> list[Prompt]:
    """The request's prompts in order: "a" -> ["a"], ["a", "b"], [1, 2] -> [(1, 2)], [[1, 2], [3]]. Sizes are checked
    before items (a body's millions of ids or prompts are refused at once): at most MAX_ANSWERS prompts, each of ids
    shorter than `context` (the answer needs a token of room)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise APIError(400, f"'prompt' must be {FORMS}{', not an empty array' if value == [] else ''}.", "prompt")
    if _is_id(value[0]):
        return [_token_ids(value, "prompt", context)]
    check_answers(len(value), 1)
    if all(isinstance(p, str) for p in value):
        return list(value)
    if all(isinstance(p, list) for p in value):
        return [_token_ids(p, f"prompt[{i}]", context, len(value) > 1) for i, p in enumerate(value)]
    raise APIError(400, f"'prompt' must be {FORMS} (one kind throughout).", "prompt")


def check_answers(prompts: int, made: int) -> None:
    """Refuses a request whose prompts times answers a prompt pass MAX_ANSWERS."""
    if prompts * made > MAX_ANSWERS:
        raise APIError(400, f"'prompt' holds {prompts:,} prompts of {made} answers each: this server makes at most "
                            f"{MAX_ANSWERS:,} answers a request.", "prompt")


def _is_id(item) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


def _token_ids(ids: list, where: str, context: int, named: bool = False) -> tuple[int, ...]:
    """`named`: one prompt of several, named in a refusal as the engine's are (app.py `_turn_error`)."""
    if not ids:
        raise APIError(400, f"'{where}' is an empty array of token ids: a prompt needs one token at least.", "prompt")
    if len(ids) >= context:  # as the engine words it (engine/session.py), before any id is read
        raise APIError(400, f"{where + ': ' if named else ''}The prompt needs {len(ids):,} tokens and one more for the "
                            f"answer, but the context holds {context:,}. Shorten it.", where if named else "prompt",
                       "context_length_exceeded")
    if set(map(type, ids)) != {int} or min(ids) < 0:  # in C: a Python loop over a long prompt's ids took seconds
        wrong = next(t for t in ids if not _is_id(t) or t < 0)
        raise APIError(400, f"'{where}' holds {json.dumps(wrong)[:40]}, not a token id (an integer of 0 or more).",
                       "prompt")
    return tuple(ids)
