"""`parley generate` / `parley chat` on a first run: the load's progress line while the CPU kernels build (seconds
with nothing to report) and after."""
from __future__ import annotations

import io

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
