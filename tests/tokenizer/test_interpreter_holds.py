"""Building a tokenizer during a model's load runs on the loader thread while the app's window waits for the
interpreter: no single call into a tokenizer library may walk the whole vocabulary while it holds the interpreter."""
from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from engine.tokenizer.hf_backend import HFBackend
from tests.support.gemma import trained_byte_level  # noqa: F401 (a fixture)


class Calls:
    """A `tokenizers.Tokenizer` whose method calls are recorded by name, each made on the real one."""

    def __init__(self, hf: HFTokenizer):
        self.hf, self.names = hf, []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.hf, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.names.append(name)
            return attr(*args, **kwargs)

        return call


def test_the_longest_token_is_found_without_the_whole_vocabulary_in_one_call(trained_byte_level):  # noqa: F811
    """HFBackend measured its longest token from `get_vocab`, a dict of the whole vocabulary built in one call that
    holds the interpreter (0.18-0.25 s for 151,300 tokens: the window's 5 ms timer ticked not once); it asks id by id
    now (10-14 ms at most between two ticks), and finds the same length."""
    calls = Calls(trained_byte_level)
    backend = HFBackend(calls)
    assert "get_vocab" not in calls.names
    longest = max(map(len, trained_byte_level.get_vocab(with_added_tokens=True)))
    assert backend.max_token_chars == longest + 1


def test_a_vocabulary_with_holes_in_its_ids_still_finds_its_longest_token():
    """A hand-made tokenizer.json may skip ids: its longest token (at an id past the vocabulary's size) still counts."""
    hf = HFTokenizer(BPE(vocab={"a": 0, "b": 2, "a" * 40: 7}, merges=[]))
    assert HFBackend(hf).max_token_chars == 41

