"""The embedded model's file: assembled whole or not at all, and assembled again when a start was cut short."""
from __future__ import annotations

from engine.loading.default_model import FILE_NAME, default_model_path
from engine.loading.gguf_header import read_header


def test_a_truncated_embedded_model_is_assembled_again(tmp_path):
    path = default_model_path(tmp_path)
    whole = path.stat().st_size
    with path.open("r+b") as f:  # a first start killed mid-write (before, every later start failed on this file)
        f.truncate(whole // 3)
    (tmp_path / f"{FILE_NAME}.partial").write_bytes(b"left by a killed assembly")
    assert default_model_path(tmp_path) == path and path.stat().st_size == whole
    assert read_header(path) is not None
    assert not (tmp_path / f"{FILE_NAME}.partial").exists()


def test_a_folder_it_cannot_write_is_one_line_naming_the_way_out(tmp_path, monkeypatch):
    import pytest

    from engine.errors import ModelLoadError

    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro"))

    monkeypatch.setattr("pathlib.Path.mkdir", refuse)
    with pytest.raises(ModelLoadError, match="folder cannot be written.*--data-dir or PARLEY_HOME"):
        default_model_path(tmp_path / "ro" / "models")
