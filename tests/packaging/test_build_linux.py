"""The full Linux installer build: PyInstaller bundle, tarball, .deb, then the unpacked bundle's --self-test under
`env -i` (packaging/build_linux.sh). About 5 min of build plus 1-2 min of self-test on 2 cores, so it is opt-in:
PARLEY_TEST_PACKAGE=1 pytest tests/packaging/test_build_linux.py  (or `make package`). Every `make test` runs the
fast checks of the same inputs in test_packaging_spec.py."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLEY_TEST_PACKAGE") != "1", reason="opt-in: set PARLEY_TEST_PACKAGE=1"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux build"),
    pytest.mark.skipif(importlib.util.find_spec("PyInstaller") is None, reason="pip install -e '.[package]'"),
]


def test_build_linux_bundle_and_self_test():
    out = subprocess.run(["bash", str(ROOT / "packaging" / "build_linux.sh"), "--python", sys.executable],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, (out.stdout[-4000:], out.stderr[-4000:])
    assert "parley self-test: ok" in out.stdout
    assert "self-test (clean env, unpacked tarball): ok in" in out.stdout
    assert "bundle checks: ok" in out.stdout  # packaging/check_bundle.py: CLI, kernels, server, Depends
    internal = ROOT / "dist" / "Parley" / "_internal"
    for gone in ("transformers", "triton", "llama_cpp", "pytest", "tests", "torch/test", "torch/include", "mlx"):
        assert not (internal / gone).exists(), gone
    assert (internal / "resources" / "icons" / "parley.svg").is_file()
    listing = subprocess.run(["dpkg-deb", "-c", *map(str, (ROOT / "dist").glob("parley_*.deb"))],
                             capture_output=True, text=True, check=True).stdout
    assert "./opt/parley/Parley" in listing and "./usr/share/applications/parley.desktop" in listing
