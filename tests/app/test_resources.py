"""resources/ reaches every kind of install: beside the package, or as a wheel's data files under share/."""

from __future__ import annotations

import glob
import sys
import tomllib
from pathlib import Path

import pytest

from app.qt import theme

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_data_files_carry_every_resource():
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = {Path(f) for patterns in data_files.values() for p in patterns for f in glob.glob(str(ROOT / p))}
    on_disk = {p for p in (ROOT / "resources").rglob("*") if p.is_file()}
    assert on_disk and on_disk == shipped, sorted(map(str, on_disk ^ shipped))
    for dest, patterns in data_files.items():  # each lands where theme.resource_dirs() looks
        for p in patterns:
            assert dest == str(Path("share/parley") / Path(p).parent), (dest, p)
    assert Path(sys.prefix) / "share" / "parley" / "resources" in theme.resource_dirs()


def test_falls_back_to_share_and_says_where_it_looked(tmp_path, monkeypatch):
    share = tmp_path / "share"
    share.mkdir()
    (share / "light.qss").write_text("")
    monkeypatch.setattr(theme, "resource_dirs", lambda: [tmp_path / "missing", share])
    assert theme.find_resources() == share
    monkeypatch.setattr(theme, "resource_dirs", lambda: [tmp_path / "missing"])
    with pytest.raises(FileNotFoundError, match="missing"):
        theme.find_resources()
