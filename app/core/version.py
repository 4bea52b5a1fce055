"""Parley's version: the installed package's, or pyproject.toml's in a checkout that was never installed."""
from __future__ import annotations

import functools
import re
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@functools.cache
def parley_version() -> str:
    try:
        return metadata.version("parley")
    except metadata.PackageNotFoundError:
        pass
    try:
        found = re.search(r'^version\s*=\s*"([^"]+)"', PYPROJECT.read_text(encoding="utf-8"), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1) if found else "unknown"


def version_line() -> str:
    """What --version prints, the app's, each command's and the packaged one's alike (packaging/parley_main.py)."""
    return f"Parley {parley_version()}"
