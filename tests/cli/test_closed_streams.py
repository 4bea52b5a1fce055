"""`parley` run with a standard stream the shell closed (`<&-`, `>&-`, `2>&-`), and how soon it answers `--help`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], tmp_path: Path, closed: int) -> subprocess.CompletedProcess:
    """`python -m cli.main ARGS` with descriptor `closed` shut before it starts, as the shell's `N>&-` leaves it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARLEY_HOME": str(tmp_path / "home")}
    pipes = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    pipes[("stdin", "stdout", "stderr")[closed]] = None
    return subprocess.run([sys.executable, "-m", "cli.main", *args], env=env, cwd=ROOT, timeout=120,
                          preexec_fn=lambda: os.close(closed), **pipes)


def test_a_closed_stdin_reads_as_empty(tmp_path):
    """`parley generate --prompt-file - <&-`: sys.stdin is None, and its read was an AttributeError traceback."""
    done = _run(["generate", "--prompt-file", "-"], tmp_path, closed=0)
    assert done.stderr.decode() == "parley: The prompt file (stdin) is empty.\n"
    assert done.returncode == 2


def test_a_closed_stdout_is_refused_before_the_model_loads(tmp_path):
    """`parley generate ... >&-` loaded the model, then its first write was an AttributeError traceback."""
    done = _run(["generate", "--prompt", "hi"], tmp_path, closed=1)
    assert done.stderr.decode() == "parley: standard output is closed (>&-): the answer would have nowhere to go\n"
    assert done.returncode == 2
    assert not (tmp_path / "home" / "models").exists()  # refused before the embedded model was written out


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["chat"]])
def test_a_closed_stderr_still_answers(tiny_models, tmp_path, command):
    """`2>&-`: the load's progress bar asked sys.stderr (None) whether it is a terminal, and the command died, exit 1
    with its traceback lost."""
    model = str(tiny_models["qwen3"].gguf_path)
    done = _run([*command, "--model", model, "--max-tokens", "2"], tmp_path, closed=2)
    assert done.returncode == 0, done.stdout  # chat's stdin is empty: it ends at once
    assert done.stdout or command == ["chat"]  # generate's answer


def test_the_help_answers_without_the_engine():
    """torch came with the engine's events at `import cli.main`: `parley --help`, `--version` and every argument error
    took 1.3 s, and a Ctrl-C in that time printed a KeyboardInterrupt traceback."""
    code = "import sys, cli.main; print(sorted(m for m in ('torch', 'engine.events') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.stdout == "[]\n", done.stderr
