"""A start under an address-space limit too small for Parley's own libraries (ulimit -v 600 MB): one line and exit 2,
before any import that would die under it with a traceback or an abort."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

resource = pytest.importorskip("resource")
ROOT = Path(__file__).resolve().parents[2]


def _limited(mb: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (mb << 20, resource.RLIM_INFINITY))


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["serve"], []])
def test_a_limit_under_the_floor_is_one_line(command, tmp_path):
    run = subprocess.run([sys.executable, "-m", "cli.main", "--data-dir", str(tmp_path), *command], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, preexec_fn=_limited(600))
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.startswith("parley: this process may use at most 600 MB of memory (ulimit -v)")
    assert len(run.stderr.splitlines()) == 1 and "Traceback" not in run.stderr
