"""The converted-weights cache cut short under a running Parley: the weights read from it are the process's own
memory, so a later change to the file (a sync tool, a copy over it) cannot kill the answer with SIGBUS."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.loading.loader import LoadOptions, load_model
from engine.loading.safetensors_read import SafetensorsUnreadable, read_safetensors


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
def test_weights_from_the_cache_map_no_part_of_it(tiny_models, tmp_path):
    path = tiny_models["llama"].gguf_path
    options = LoadOptions(cache_dir=tmp_path, weights="dequantized")
    expected = {k: v.clone() for k, v in load_model(path, options).model.state_dict().items()}
    loaded = load_model(path, options)
    assert loaded.timings["from"] == "converted-cache"
    (entry,) = (tmp_path / "converted").iterdir()
    weights = entry / "model.safetensors"
    assert str(weights) not in Path("/proc/self/maps").read_text()
    os.truncate(weights, 0)  # mapped, a touch of any weight past here raised SIGBUS
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_a_file_cut_short_is_refused_and_a_whole_one_reads(tmp_path):
    f = tmp_path / "w.safetensors"
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(5, dtype=torch.bfloat16),
               "empty": torch.zeros(0, 4), "scalar": torch.tensor(7, dtype=torch.int64)}
    save_file(tensors, str(f))
    got = read_safetensors(f)
    assert got.keys() == tensors.keys() and all(torch.equal(got[k], v) for k, v in tensors.items())
    os.truncate(f, f.stat().st_size - 3)
    with pytest.raises(SafetensorsUnreadable):
        read_safetensors(f)
    f.write_bytes(b"\xff" * 8)
    with pytest.raises(SafetensorsUnreadable):
        read_safetensors(f)
