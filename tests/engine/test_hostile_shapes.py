"""A GGUF file whose metadata disagrees with its tensors (area BG) is refused from its header, before a byte of its
weights is read, in one line naming the tensor, its shape and the shape the metadata asks for."""
from __future__ import annotations

import pytest

from engine.errors import ParleyError
from engine.loading.gguf_file import TensorSource
from tests.engine.test_hostile_gguf import V, _mutate_tensor, load_bounded, read_layout


@pytest.fixture(scope="module")
def llama(tiny_models):
    return read_layout(tiny_models["llama"].gguf_path)


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The tensors whose bytes the load reads (by file offset)."""
    seen: list[str] = []
    real = TensorSource.read
    monkeypatch.setattr(TensorSource, "read", lambda self, offset, n: seen.append(offset) or real(self, offset, n))
    return seen


def _set(key: str, value: int):
    return lambda layout: layout.set(key, V.UINT32, value)


# the tiny llama: embedding 64, 4 heads of 16 (2 KV heads), feed-forward 128, 406 tokens
@pytest.mark.parametrize("change, words", [
    (_set("llama.embedding_length", 96), "tensor token_embd.weight has shape [64, 406], the metadata's sizes need "
                                         "[96, 406] (and 20 more tensors disagree)"),
    (_set("llama.attention.head_count", 8), "tensor blk.0.attn_output.weight has shape [64, 64], the metadata's "
                                            "sizes need [128, 64] (and 3 more"),
    (_set("llama.feed_forward_length", 256), "tensor blk.0.ffn_down.weight has shape [128, 64], the metadata's sizes "
                                             "need [256, 64] (and 5 more"),
    # the same bytes as 128 rows of 64: the header alone cannot tell, the model's shape can
    (lambda layout: _mutate_tensor(layout, "blk.1.ffn_up.weight", dims=[128, 64]),
     "tensor blk.1.ffn_up.weight has shape [128, 64], the metadata's sizes need [64, 128]."),
], ids=["wider embedding", "more heads", "wider feed-forward", "transposed"])
def test_a_tensor_the_metadata_does_not_describe_is_refused_before_any_weight_is_read(llama, tmp_path, reads, change,
                                                                                    words):
    result = load_bounded(change(llama).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and f"m.gguf does not match its own metadata: {words}" in str(result), result
    assert reads == [], f"{len(reads)} tensors were read before the refusal"


@pytest.mark.parametrize("name, words", [
    ("blk.1.ffn_dawn.weight", "unexpected tensor blk.1.ffn_dawn.weight for architecture llama"),
    # a name the architecture knows, for a module this model lacks (no q/k norms): and one module left without
    ("blk.1.attn_q_norm.weight", "missing tensors: model.layers.1.post_attention_layernorm.weight; unexpected "
                                 "tensors: model.layers.1.self_attn.q_norm.weight"),
])
def test_a_tensor_the_model_has_no_place_for_is_refused_before_any_weight_is_read(llama, tmp_path, reads, name, words):
    renamed = _mutate_tensor(llama, "blk.1.ffn_norm.weight", name=name)
    result = load_bounded(renamed.write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and words in str(result), result
    assert reads == []


def test_a_file_that_agrees_with_its_metadata_loads(llama, tmp_path, reads):
    """The check passes what the loader takes (every architecture's tiny model loads in its own test file)."""
    assert not isinstance(load_bounded(llama.write(tmp_path / "m.gguf")), ParleyError)
    assert reads, "the weights were read"
