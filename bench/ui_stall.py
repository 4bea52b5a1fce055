"""The longest Qt event-loop stall while 8 chats stream on the embedded model, the live panel open (target < 50 ms).

A 5 ms QTimer records the gap between its ticks (wall clock) and the GUI thread's own CPU time in that gap:
a long gap with little GUI CPU is the OS or the GIL not giving the thread a core, not our code blocking.
Baseline: the same window with nothing streaming.
Prints JSON lines. Usage: python bench/ui_stall.py [--chats 8] [--tokens 48] [--model-cache DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PySide6.QtCore import QElapsedTimer, QTimer  # noqa: E402
from bench.gui_harness import fresh_data_dir, pump_until  # noqa: E402

TICK_MS = 5
TARGET_MS = 50.0
PROMPTS = ["Tell me about the sea.", "Write a short poem about autumn.", "Explain how a bicycle works.",
           "List some fruits.", "Describe a city at night.", "What is a prime number?",
           "Write a story about a robot.", "Give advice for a job interview."]


class StallMeter:
    """Gaps between ticks of a 5 ms timer; a gap well above 5 ms is the loop being blocked."""

    def __init__(self):
        self.clock = QElapsedTimer()
        self.gaps: list[float] = []
        self.busy: list[float] = []  # GUI-thread CPU time between ticks: our own work, not waiting for a core
        self.timer = QTimer(interval=TICK_MS)
        self.timer.timeout.connect(self._tick)
        self._last = None

    def start(self) -> None:
        self.gaps.clear()
        self.busy.clear()
        self.clock.start()
        self._last = self.clock.nsecsElapsed()
        self._last_cpu = time.thread_time()
        self.timer.start()

    def stop(self) -> dict:
        self.timer.stop()
        gaps = sorted(self.gaps) or [0.0]
        worst = max(range(len(self.gaps)), key=self.gaps.__getitem__) if self.gaps else None
        return {"ticks": len(self.gaps), "max_stall_ms": round(gaps[-1], 2),
                "p99_ms": round(gaps[int(0.99 * (len(gaps) - 1))], 2), "mean_ms": round(sum(gaps) / len(gaps), 2),
                "max_gui_busy_ms": round(max(self.busy, default=0.0), 2),
                "worst_stall_gui_busy_ms": round(self.busy[worst], 2) if worst is not None else 0.0}

    def _tick(self) -> None:
        now, cpu = self.clock.nsecsElapsed(), time.thread_time()
        self.gaps.append((now - self._last) / 1e6)
        self.busy.append((cpu - self._last_cpu) * 1e3)
        self._last, self._last_cpu = now, cpu





def pump_for(seconds: float) -> None:
    pump_until(lambda: False, seconds)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--chats", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--no-live-panel", action="store_true", help="leave the live generations panel closed")
    p.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for this run (GIL hand-offs)")
    p.add_argument("--model-cache", default=str(Path(tempfile.gettempdir()) / "parley-bench"),
                   help="keeps the assembled and converted model between runs; chats start empty every run")
    args = p.parse_args()

    from app.qt.main import build, qt_app

    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)

    qt_app()
    app = build(fresh_data_dir(args.model_cache), theme="light")
    service, window = app.service, app.window
    window.resize(1200, 800)
    window.live_panel.setVisible(not args.no_live_panel)  # every generation listed, refreshed 4× a second
    if not pump_until(lambda: app.models.model_id("default") is not None, 300):
        print(json.dumps({"bench": "ui_stall", "error": "the embedded model did not load"}))
        return 1
    convs = [window.current()] + [window.new_chat() for _ in range(args.chats - 1)]
    for conv in convs:
        service.set_settings(conv, service.store.get(conv).settings.copy(max_tokens=args.tokens, temperature=0.0))
    meter = StallMeter()
    meter.start()
    pump_for(2.0)
    baseline = meter.stop()
    print(json.dumps({"bench": "ui_stall", "phase": "idle", "switch_interval_s": sys.getswitchinterval(), "chats": 0, **baseline}), flush=True)

    flushes = app.bridge.flushes
    meter.start()
    start = time.perf_counter()
    for i, conv in enumerate(convs):  # one send per event-loop turn, as a user would
        QTimer.singleShot(20 * i, lambda c=conv, t=PROMPTS[i % len(PROMPTS)]: (window.open_chat(c), window.chat.send(t)))
    pump_until(lambda: all(service.busy(c) for c in convs), 10)
    switches = 0
    while any(service.busy(c) for c in convs):
        pump_for(0.5)
        window.step_chat(1)  # switching chats while they stream must stay instant
        switches += 1
        if time.perf_counter() - start > 600:
            break
    elapsed = time.perf_counter() - start
    streaming = meter.stop()
    answers = [service.store.path(c)[-1] for c in convs]
    tokens = sum((a.stats or {}).get("completion_tokens", 0) for a in answers)
    row = {
        "bench": "ui_stall", "phase": "streaming", "chats": len(convs), **streaming,
        "vs_idle_max": round(streaming["max_stall_ms"] / max(baseline["max_stall_ms"], 1e-3), 2),
        "target_ms": TARGET_MS, "pass": streaming["max_stall_ms"] < TARGET_MS,
        "answered": sum(a.state == "done" for a in answers), "tokens": tokens,
        "aggregate_tok_s": round(tokens / elapsed, 1), "seconds": round(elapsed, 1),
        "repaints_per_s": round((app.bridge.flushes - flushes) / elapsed, 1), "chat_switches": switches,
        "live_panel": not args.no_live_panel, "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
    }
    print(json.dumps(row), flush=True)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
