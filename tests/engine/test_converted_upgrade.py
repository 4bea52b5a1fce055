"""The converted-weights cache after an upgrade: entries an older Parley wrote (no `source` file) are removed once
this version writes its own entry of the file, not left on disk beside it (a model's whole fp32 copy)."""
from __future__ import annotations

import shutil
from pathlib import Path

from engine.loading.loader import LoadOptions, load_model


def _older_parley_entry(entry: Path, name: str) -> Path:
    """A copy of `entry` as Parley wrote it before entries named their source file: under another key, no `source`."""
    old = entry.parent / name
    shutil.copytree(entry, old)
    (old / "source").unlink()
    return old


def test_an_older_parleys_entry_of_the_file_is_dropped(tiny_models, tmp_path):
    path = tiny_models["llama"].gguf_path
    options = LoadOptions(cache_dir=tmp_path, weights="dequantized")
    load_model(path, options)
    (entry,) = (tmp_path / "converted").iterdir()
    old = _older_parley_entry(entry, f"{path.stem}-0123456789abcdef")
    other = _older_parley_entry(entry, "another-model-0123456789abcdef")  # another file's: kept
    shutil.rmtree(entry)  # the upgrade: this version's key is not there yet
    assert load_model(path, options).timings["from"] == "gguf"
    assert sorted(p.name for p in (tmp_path / "converted").iterdir()) == sorted([entry.name, other.name])
    assert not old.exists()
    assert load_model(path, options).timings["from"] == "converted-cache"
