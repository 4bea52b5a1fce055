"""What README.md tells a new user, checked against the code: its benchmark commands start."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _bench_commands() -> list[list[str]]:
    """The README's benchmark lines as argv after the interpreter: ['bench/x.py'] or ['-m', 'bench.x']."""
    block = README.split("## Benchmarks", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.strip().splitlines():
        words = line.split("#", 1)[0].split()
        assert words and words[0].endswith("python"), line
        commands.append([w for w in words[1:] if w != "--check"])
    return commands


@pytest.mark.parametrize("argv", _bench_commands(), ids=lambda a: a[-1])
def test_readme_bench_commands_start(argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user runs it: from the checkout, no path set
    run = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
