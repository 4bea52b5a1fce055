"""`parley generate` and `parley chat` as a user drives them from a shell: a pipe closed early, a terminal's
Ctrl-D, a signal mid-answer."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PARLEY_HOME": str(tmp_path / "home")}


def test_a_pipe_closed_before_the_output_is_no_traceback(tiny_models, tmp_path):
    """`parley generate ... | head -1`: the reader gone, the next write raised BrokenPipeError, a traceback."""
    args = [sys.executable, "-m", "cli.main", "generate", "--model", str(tiny_models["qwen3"].gguf_path),
            "--prompt", "a", "--prompt", "b", "--max-tokens", "2", "--json"]
    proc = subprocess.Popen(args, env=_env(tmp_path), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves before the first line: every write meets a closed pipe
    _, err = proc.communicate(timeout=120)
    assert err.decode() == ""
    assert proc.returncode == 141
