"""A Hugging Face folder whose weights are shards (model-00001-of-00002.safetensors, model.safetensors.index.json):
it loads as the single file does, and a shard that is not there is one line naming it, with or without the index."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.core.sqlite_registry import check_model
from engine.errors import ModelLoadError
from engine.loading.loader import load_model

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@pytest.fixture
def sharded(tiny_models, tmp_path):
    """The tiny llama's folder with its weights in two shards and an index, as transformers saves a large model."""
    folder = tmp_path / "sharded"
    shutil.copytree(tiny_models["llama"].hf_dir, folder)
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    groups = dict(zip(SHARDS, (names[:len(names) // 2], names[len(names) // 2:])))
    for shard, group in groups.items():
        save_file({n: weights[n] for n in group}, str(folder / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {n: shard for shard, group in groups.items() for n in group}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_a_sharded_folder_loads_as_its_single_file(tiny_models, sharded):
    whole = load_model(tiny_models["llama"].hf_dir).model.state_dict()
    got = load_model(sharded).model.state_dict()
    assert got.keys() == whole.keys() and all(torch.equal(got[k], whole[k]) for k in whole)


def _index_names_a_missing_file(folder):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"][next(iter(index["weight_map"]))] = "model-00003-of-00003.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return "model-00003-of-00003.safetensors"


def _shard_gone(folder):
    (folder / SHARDS[1]).unlink()
    return SHARDS[1]


def _shard_and_index_gone(folder):
    (folder / "model.safetensors.index.json").unlink()
    return _shard_gone(folder)


@pytest.mark.parametrize("damage", [_index_names_a_missing_file, _shard_gone, _shard_and_index_gone])
def test_a_shard_not_there_is_named_before_loading(sharded, damage):
    missing = damage(sharded)
    with pytest.raises(ModelLoadError, match=f"is missing weight shards: {missing}$"):
        load_model(sharded)
    with pytest.raises(ValueError, match=f"is missing weight shards: {missing}$"):  # the app's import check
        check_model(sharded)
