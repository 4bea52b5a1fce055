"""Model paths that are not what they seem: a file removed while it loads, an empty file, a file of a Hugging Face
folder given for the model. Each is one line saying what happened, not a raw OSError or 'wrong magic bytes'."""
from __future__ import annotations

import os
import shutil

import pytest

from engine.errors import ModelLoadError
from engine.loading import loader
from engine.loading.gguf_header import scan_header
from engine.loading.loader import LoadOptions, load_model


def test_a_model_removed_while_it_loads_is_named(tiny_models, tmp_path, monkeypatch):
    """Through a link whose file goes after it was opened (the tokenizer cache's key stats the path again): it was
    'Could not load link.gguf: FileNotFoundError(2, ...)' from parley generate."""
    target, link = tmp_path / "model.gguf", tmp_path / "link.gguf"
    shutil.copy(tiny_models["llama"].gguf_path, target)
    link.symlink_to(target)
    real = loader.open_gguf
    monkeypatch.setattr(loader, "open_gguf", lambda *a, **k: (real(*a, **k), target.unlink())[0])
    with pytest.raises(ModelLoadError, match=r"^link.gguf was moved or removed while it loaded: load it from where"):
        load_model(link, LoadOptions(cache_dir=tmp_path / "cache"))


def test_an_empty_file_is_called_empty(tmp_path):
    path = tmp_path / "model.gguf"
    path.touch()
    for read in (load_model, scan_header):  # the load, and the app's import check
        with pytest.raises(ModelLoadError, match=r"^model.gguf is empty \(0 bytes\), not a GGUF model file: a copy"):
            read(path)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_file_of_a_hugging_face_folder_names_the_folder(tiny_models, tmp_path, name):
    folder = tmp_path / "tiny llama"
    shutil.copytree(tiny_models["llama"].hf_dir, folder)
    with pytest.raises(ModelLoadError, match=f"^{name} is not a GGUF model file but a file of the Hugging Face model "
                                             f"folder {folder}: load the folder."):
        load_model(folder / name)


def test_a_name_that_is_not_utf8_is_shown_with_a_mark(tmp_path):
    """Its undecodable byte reached the message as a surrogate escape: parley generate printed 'ze\\udcffro.gguf',
    the app's Qt dropped it ('zero.gguf'), and UTF-8 (a JSON body) cannot encode it."""
    path = tmp_path / os.fsdecode(b"ze\xffro.gguf")
    try:
        path.touch()
    except OSError:  # a file system that takes UTF-8 names only
        pytest.skip("no such name here")
    with pytest.raises(ModelLoadError) as err:
        load_model(path)
    assert str(err.value).startswith("ze\ufffdro.gguf is empty") and str(err.value).encode("utf-8")
