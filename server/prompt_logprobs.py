"""/v1/completions' `echo` with `logprobs`: the prompt's own log-probabilities before the answer's, and `max_tokens: 0`
with `echo`: the prompt alone, streamed or not. lm-evaluation-harness's loglikelihood tasks (hellaswag, arc) send
both and sum a continuation's `token_logprobs`; the entries are vLLM's legacy ones (the first token's number and top
are null). A streamed scored echo goes once the prefill has scored it, with its entries, before the answer's text.

The engine computes them during the prompt's prefill (engine/prompt_logprobs.py) and still makes one token for a
prompt-only request (its logits come from the prompt's last row, in the same step), which the answer drops. Of a
prompt's `n` choices the first scores it; the others copy its cache (the engine's `follow`: one prefill, where each
scored its own) and are sent its entries. Each lists an end-of-turn token its answer ends with (its params' `echo`,
kept where they drop prompt_logprobs: engine/local_host.py `_logprobs`)."""
from __future__ import annotations

import dataclasses

from collections import deque

from engine import events as ev
from engine.logprobs import NamedLogprob
from server.logprobs import StreamedLogprobs, completion_logprobs


def echo_only(data: dict, echo: bool) -> tuple[dict, bool]:
    """The request as the engine takes it, and whether it asks for the prompt alone (`max_tokens: 0` with `echo`: one
    token is made, then dropped). Without `echo`, a 0 is refused as any count under 1 is."""
    asked = data.get("max_tokens")
    if not echo or isinstance(asked, bool) or asked != 0 or data.get("max_completion_tokens") is not None:
        return data, False
    return {**data, "max_tokens": 1}, True


def prompt_alone(ends: list[ev.Event], logprobs: list[list] | None) -> tuple[list[ev.Event], list[list] | None]:
    """Each answer's end as a prompt-only request's: no text, no token (the one made is dropped), cut by its length."""
    ends = [dataclasses.replace(e, text="", reason="length", stats=dataclasses.replace(e.stats, completion_tokens=0))
            for e in ends]
    return ends, None if logprobs is None else [[] for _ in logprobs]


def scored_echo(chunk: dict, entries: list[NamedLogprob], streamed: StreamedLogprobs, unwritten: int = 0) -> dict:
    """A streamed choice's echo chunk with its prompt's entries (sent once the prefill has scored them, before the
    answer's text); the answer's offsets go on from the prompt's. `unwritten`: leading entries the echo does not
    write (server/logprobs.py `completion_logprobs`)."""
    chunk["choices"][0]["logprobs"] = completion_logprobs(entries, 0, unwritten)
    streamed.offset = sum(len(e.token) for e in entries[unwritten:])
    return chunk


def joined(prompts: list[list[NamedLogprob] | None], answers: list[list] | None) -> list[list[NamedLogprob]]:
    """Each choice's entries: its prompt's, then its answer's (where the answer's were asked)."""
    answers = answers or [[] for _ in prompts]
    return [(p or []) + a for p, a in zip(prompts, answers)]


def shared(scored: list[list[NamedLogprob] | None], made: int) -> list[list[NamedLogprob] | None]:
    """Each choice's prompt entries (`made` choices a prompt, prompt by prompt): its prompt's first choice's."""
    return [scored[k - k % made] for k in range(len(scored))]


class SharedEcho:
    """A streamed request's prompt entries, scored by each prompt's first choice and sent with every choice's echo:
    the other choices' events wait until their prompt's entries have come (with its first choice's first token)."""

    def __init__(self, made: int) -> None:
        self.made = made
        self.entries: dict[int, list[NamedLogprob]] = {}  # a prompt's first choice -> its entries
        self.waiting: dict[int, list[ev.Event]] = {}  # a prompt's first choice -> its other choices' events so far
        self.echoed: set[int] = set()

    def waits(self, i: int, e: ev.Event) -> bool:
        """Whether choice i's event `e` is held until its prompt's entries come (it is given back by `echo`)."""
        lead = i - i % self.made
        if i == lead and isinstance(e, ev.TokenDelta) and e.prompt_logprobs is not None:
            self.entries[lead] = e.prompt_logprobs
        if lead in self.entries:
            return False
        self.waiting.setdefault(lead, []).append(e)
        return True

    def echo(self, i: int, held: deque) -> list[NamedLogprob] | None:
        """The entries to send with choice i's echo, at its first event (None after); a prompt's first choice puts
        the events its others held back into `held`, to be read next."""
        if i in self.echoed:
            return None
        self.echoed.add(i)
        held.extend(self.waiting.pop(i, []))
        return self.entries[i - i % self.made]
