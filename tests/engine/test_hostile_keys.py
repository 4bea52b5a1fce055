"""GGUF size keys that lie (area BG): each is refused at load in one line naming the key, before the architecture
reads it (a count of the wrong kind or out of range) or after (a key its reader passed over that says another model)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import ParleyError, UnsupportedModelError
from engine.loading.loader import LoadOptions, load_model
from tests.engine.test_hostile_gguf import V, load_bounded, read_layout
from tests.support.gguf_export import write_gguf
from tests.support.tiny_models import make_tiny_hf


@pytest.fixture(scope="module")
def llama(tiny_models):
    """Embedding 64, 4 heads of 16, a whole head rotating, 406 tokens; its file holds every key below."""
    return read_layout(tiny_models["llama"].gguf_path)


# each loaded before: the model the file describes is not the one Parley ran (or llama.cpp would refuse it)
@pytest.mark.parametrize("key, vtype, value, words", [
    ("llama.rope.dimension_count", V.UINT32, 8, "llama.rope.dimension_count says 8 dims of each 16-dim attention "
                                                "head rotate; Parley's llama rotates 16."),
    ("llama.rope.dimension_count", V.UINT32, 0, "llama.rope.dimension_count must be a whole number from 1 to"),
    ("llama.rope.dimension_count", V.INT32, -2, "llama.rope.dimension_count must be a whole number from 1 to"),
    ("llama.attention.value_length", V.UINT32, 8, "values of 8 dims (llama.attention.value_length) but keys of 16 "
                                                  "(llama.attention.key_length)"),
    ("llama.vocab_size", V.UINT32, 407, "llama.vocab_size is 407 but the model embeds 406 tokens."),
    ("llama.vocab_size", V.UINT64, 2**40, "llama.vocab_size must be a whole number from 1 to 1,048,576, not "
                                          "1,099,511,627,776."),
])
def test_a_size_key_that_describes_another_model_is_refused(llama, tmp_path, key, vtype, value, words):
    result = load_bounded(llama.set(key, vtype, value).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and words in str(result), result


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


def test_an_odd_head_width_is_refused_at_load(tiny_models, tmp_path):
    """A rotary turns pairs of dims: a folder of 15-dim heads loaded, and its first forward failed ('The size of
    tensor a (15) must match the size of tensor b (16)')."""
    folder = shutil.copytree(tiny_models["llama"].hf_dir, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "head_dim": 15}))
    weights = load_file(folder / "model.safetensors")
    heads = {"q_proj": 4, "k_proj": 2, "v_proj": 2}
    for name, tensor in weights.items():
        part = name.split(".")[-2]
        if part in heads:
            weights[name] = torch.zeros(heads[part] * 15, tensor.shape[1])
        elif part == "o_proj":
            weights[name] = torch.zeros(tensor.shape[0], 4 * 15)
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(UnsupportedModelError, match="heads are 15 dims wide; a rotary embedding needs an even"):
        load_model(folder, LoadOptions())
