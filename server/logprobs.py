"""Log-probabilities in OpenAI's two shapes: chat's `logprobs.content` entries and a completion's parallel lists.

A token's text is its id decoded alone (engine/logprobs.py `named`); a token that holds part of a character decodes to
U+FFFD there, and its `bytes` are those of that text, as vLLM reports such a token."""
from __future__ import annotations

from engine.logprobs import NamedLogprob


def chat_logprobs(entries: list[NamedLogprob]) -> dict:
    return {"content": [_chat_entry(e.token, e.logprob) | {"top_logprobs": [_chat_entry(t, v) for t, v in e.top]}
                        for e in entries], "refusal": None}


def _chat_entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "surrogatepass"))}


def completion_logprobs(entries: list[NamedLogprob], offset: int = 0, unwritten: int = 0) -> dict:
    """`offset`: where the first token's text starts in the choice's text (a stream's earlier chunks); `unwritten`:
    leading entries whose text the choice's text does not hold (the BOS before an echoed text prompt): they start at
    `offset` and take no room, so the first written token's offset is where its text is."""
    offsets = []
    for k, e in enumerate(entries):
        offsets.append(offset)
        offset += len(e.token) if k >= unwritten else 0
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.logprob is None else _by_text(e) for e in entries], "text_offset": offsets}


def _by_text(entry: NamedLogprob) -> dict[str, float]:
    """The legacy shape keys tokens by text: of two tokens with one text, the more likely one's number stays. The
    chosen token is always there, after the top ones where it is not among them (OpenAI's "up to logprobs + 1
    elements", as vLLM and llama.cpp's server list it)."""
    out: dict[str, float] = {}
    for text, value in (*entry.top, (entry.token, entry.logprob)):
        out.setdefault(text, value)
    return out


class StreamedLogprobs:
    """One streamed choice's entries: each token's goes with the first chunk sent after it (a token whose text is held
    back, a stop string's start or part of a character, goes with the text that follows)."""

    def __init__(self, raw: bool):
        self.raw, self.held, self.offset = raw, [], 0

    def attach(self, chunk: dict) -> dict:
        entries, self.held = self.held, []
        if not entries:  # a chunk of no token's text (a held-back tail, the end), or none asked: null, as OpenAI's
            return chunk
        if self.raw:
            chunk["choices"][0]["logprobs"] = completion_logprobs(entries, self.offset)
            self.offset += sum(len(e.token) for e in entries)
        else:
            chunk["choices"][0]["logprobs"] = chat_logprobs(entries)
        return chunk
