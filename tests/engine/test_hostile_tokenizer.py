"""Hostile tokenizer metadata and chat templates in a GGUF (issue 23, stop 78's mutation sweep): a tokenizer that
cannot be built is one clear line at load; a template that loops, nests or grows without end fails its turn quickly,
without allocating gigabytes."""
from __future__ import annotations

import gguf
import pytest

from engine.errors import ParleyError, TokenizerError
from tests.engine.test_hostile_gguf import Layout, load_bounded, read_layout

V = gguf.GGUFValueType


@pytest.fixture(scope="module")
def llama(tiny_models) -> Layout:
    return read_layout(tiny_models["llama"].gguf_path)


def _merges(layout: Layout) -> list[str]:
    return list(layout.kv["tokenizer.ggml.merges"][1])


@pytest.mark.parametrize("change", ["unknown pieces", "three pieces", "only spaces", "empty tokens"])
def test_a_bpe_vocabulary_its_merges_do_not_fit_is_one_clear_line(llama, tmp_path, change):
    """tokenizers' bare Exception ('Error while initializing BPE: Token `zzq` out of vocabulary') reached the user
    as 'Could not load m.gguf: Exception(...)'."""
    n = len(_merges(llama))
    if change == "unknown pieces":
        bad = llama.set("tokenizer.ggml.merges", V.ARRAY, ["zzq qqz"] * n, V.STRING)
    elif change == "three pieces":
        bad = llama.set("tokenizer.ggml.merges", V.ARRAY, [m + " x" for m in _merges(llama)], V.STRING)
    elif change == "only spaces":
        bad = llama.set("tokenizer.ggml.merges", V.ARRAY, ["   "] * n, V.STRING)
    else:
        tokens = llama.kv["tokenizer.ggml.tokens"][1]
        bad = llama.set("tokenizer.ggml.tokens", V.ARRAY, [""] * len(tokens), V.STRING)
    result = load_bounded(bad.write(tmp_path / "m.gguf"))
    assert isinstance(result, TokenizerError) and "cannot be built" in str(result), repr(result)
