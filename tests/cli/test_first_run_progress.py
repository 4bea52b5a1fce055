"""`parley generate` / `parley chat` on a first run: the load's progress line while the CPU kernels build (seconds
with nothing to report) and after."""
from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.engine_cli import EngineCLI
from cli.load_bar import LoadBar
from engine.runtime import EngineConfig

BUILD = "Building Parley's CPU kernels (once for this computer)"


def _last_line(out: io.StringIO) -> str:
    return out.getvalue().split("\r")[-1]


def test_a_stage_with_nothing_to_report_counts_its_seconds_and_the_next_starts_at_zero():
    """The kernel build (15 s here, no fraction) sat at "0/100 [00:00<?, ?it/s]" without a redraw, then the weights'
    first percent read "[00:15<26:12, 15.89s/it]": 26 minutes to go for a stage of 4 s."""
    out, now = io.StringIO(), [100.0]
    bar = LoadBar(out, clock=lambda: now[0], enabled=True)
    bar.show(BUILD, 0.0)
    now[0] += 15
    bar.tick()  # what EngineCLI.load calls each second without an event
    assert _last_line(out).startswith(f"{BUILD} · 15 s:   0%|")
    bar.show("Decoding weights", 0.0)
    now[0] += 0.5
    bar.show("Decoding weights", 0.01)
    line = _last_line(out)
    assert line.startswith("Decoding weights · 0 s:   1%|"), line
    assert "it/s" not in line and "<" not in line  # no rate or estimate from the build's seconds
    bar.close()


def test_a_load_without_events_for_a_while_calls_idle(tiny_models):
    cli = EngineCLI(EngineConfig(max_sessions=1, max_session_tokens=256))
    ticks = []
    try:
        cli.load(tiny_models["qwen3"].gguf_path, idle=lambda: ticks.append(1), idle_s=1e-4)
    finally:
        cli.close()
    assert ticks  # the load took longer than 0.1 ms, and said nothing for at least that long


GENERATE = "import sys; from cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the kernels build on x86-64")
def test_a_first_load_without_a_terminal_says_the_kernels_build_first(tiny_models_q8, tmp_path):
    """stderr no terminal (a script, serve's log): no progress line, and the first load was 15-30 s of silence. The
    compiler here fails at once (`false`): what is checked is the line before the build, not the build."""
    env = {**os.environ, "CC": shutil.which("false") or "false", "PARLEY_KERNEL_CACHE": str(tmp_path / "kernels")}
    env.pop("PARLEY_CPU_KERNEL", None)
    run = subprocess.run([sys.executable, "-c", GENERATE, "--data-dir", str(tmp_path), "generate", "--model",
                          str(tiny_models_q8["qwen3"].gguf_path), "--max-tokens", "2", "--prompt", "hi"],
                         capture_output=True, text=True, env=env, timeout=120, cwd=Path(__file__).parents[2])
    assert run.returncode == 0, run.stderr
    assert run.stderr.startswith("parley: building Parley's CPU kernels before the first load"), run.stderr
