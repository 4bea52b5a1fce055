"""A start under an address-space limit too small for Parley's own libraries (ulimit -v 600 MB to 1,030 MB): one line and exit 2,
before any import that would die under it with a traceback or an abort."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

resource = pytest.importorskip("resource")
ROOT = Path(__file__).resolve().parents[2]


def _limited(mb: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (mb << 20, resource.RLIM_INFINITY))


# the limits where each died before: an import's traceback, a Fatal Python error, the app hung on a QThread
@pytest.mark.parametrize(("command", "mb"), [(["generate", "--prompt", "hi"], 600), (["serve"], 700),
                                             (["--self-test"], 1030)])
def test_a_limit_under_the_floor_is_one_line(command, mb, tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    run = subprocess.run([sys.executable, "-m", "cli.main", "--data-dir", str(tmp_path), *command], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, preexec_fn=_limited(mb))
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.startswith(f"parley: this process may use at most {mb:,} MB of memory (ulimit -v)")
    assert len(run.stderr.splitlines()) == 1 and "Traceback" not in run.stderr
