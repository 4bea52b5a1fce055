"""GGUF size keys that lie (area BG): each is refused at load in one line naming the key, before the architecture
reads it (a count of the wrong kind or out of range)."""
from __future__ import annotations

import pytest

from engine.errors import ParleyError
from tests.engine.test_hostile_gguf import V, load_bounded, read_layout
from tests.support.gguf_export import write_gguf
from tests.support.tiny_models import make_tiny_hf


@pytest.fixture(scope="module")
def llama(tiny_models):
    """Embedding 64, 4 heads of 16, a whole head rotating, 406 tokens; its file holds every key below."""
    return read_layout(tiny_models["llama"].gguf_path)


@pytest.mark.parametrize("vtype, value, words", [
    (V.BOOL, True, "wrong kind for llama.context_length: True, where a whole number belongs."),  # was a 1-token context
    (V.FLOAT32, 4096.5, "wrong kind for llama.context_length: 4096.5,"),  # was 4096
    (V.STRING, "4096", "wrong kind for llama.context_length: '4096',"),  # was 4096
    (V.UINT64, 2**62, "llama.context_length must be a whole number from 1 to 16,777,216, not "),  # named a field
])
def test_a_context_length_of_the_wrong_kind_or_size_is_refused_by_its_key(llama, tmp_path, vtype, value, words):
    result = load_bounded(llama.set("llama.context_length", vtype, value).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and words in str(result), result


def test_a_context_beyond_a_million_tokens_loads_as_the_model_says(llama, tmp_path):
    """Llama 4 Scout's 10M (Llama-3-8B-Gradient's 4M were refused over 2**20): the sessions hold what they are set
    to, so nothing grows with it."""
    lm = load_bounded(llama.set("llama.context_length", V.UINT32, 10_485_760).write(tmp_path / "m.gguf"))
    assert not isinstance(lm, ParleyError), lm
    assert lm.args.max_position_embeddings == 10_485_760


@pytest.fixture(scope="module")
def glm4_moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("glm4_moe")
    return read_layout(write_gguf(make_tiny_hf("glm4_moe", root / "hf"), root / "f32.gguf"))


def test_a_huge_count_of_dense_layers_is_refused_before_a_list_of_them_is_made(glm4_moe, tmp_path):
    """list(range(2**26)) took 12.7 s and 2.5 GB; 2**40 ended in a raw MemoryError."""
    result = load_bounded(glm4_moe.set("glm4moe.leading_dense_block_count", V.UINT64, 2**40).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and "glm4moe.leading_dense_block_count must be" in str(result), result
