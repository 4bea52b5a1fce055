"""/v1/completions' `prompt` in OpenAI's four forms: a string, an array of strings, an array of token ids, or an array
of arrays of token ids. Each prompt of an array is answered on its own, as vLLM's and OpenAI's servers do."""
from __future__ import annotations

import json

from server.api_error import APIError

Prompt = str | tuple[int, ...]  # a text document, or one as token ids (sent to the model as they are)
FORMS = "a string, an array of strings, an array of token ids or an array of arrays of token ids"
MAX_ANSWERS = 2048  # prompts x best_of: each answer is a session, queued for a slot


def completion_prompts(value) -> list[Prompt]:
    """The request's prompts in order: "a" -> ["a"], ["a", "b"], [1, 2] -> [(1, 2)], [[1, 2], [3]]."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise APIError(400, f"'prompt' must be {FORMS}{', not an empty array' if value == [] else ''}.", "prompt")
    if all(isinstance(p, str) for p in value):
        return list(value)
    if all(isinstance(p, int) and not isinstance(p, bool) for p in value):
        return [_token_ids(value, "prompt")]
    if all(isinstance(p, list) for p in value):
        return [_token_ids(p, f"prompt[{i}]") for i, p in enumerate(value)]
    raise APIError(400, f"'prompt' must be {FORMS} (one kind throughout).", "prompt")


def check_answers(prompts: int, made: int) -> None:
    """Refuses a request whose prompts times answers a prompt pass MAX_ANSWERS."""
    if prompts * made > MAX_ANSWERS:
        raise APIError(400, f"'prompt' holds {prompts:,} prompts of {made} answers each: this server makes at most "
                            f"{MAX_ANSWERS:,} answers a request.", "prompt")


def _token_ids(ids: list, where: str) -> tuple[int, ...]:
    if not ids:
        raise APIError(400, f"'{where}' is an empty array of token ids: a prompt needs one token at least.", "prompt")
    wrong = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or t < 0]
    if wrong:
        raise APIError(400, f"'{where}' holds {json.dumps(wrong[0])[:40]}, not a token id (an integer of 0 or more).",
                       "prompt")
    return tuple(ids)
