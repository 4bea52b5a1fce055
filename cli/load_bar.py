"""A model load's progress line on a terminal (stderr): each stage with its own seconds, counting on while the stage
reports no fraction.

tqdm's own clock and rate ran over the whole load: a first run's kernel build sat at "0/100 [00:00<?, ?it/s]" for
its 15 s (no event, no redraw), then the weights' first percent read "[00:15<26:12, 15.89s/it]", 26 minutes to go for
a stage of 4 s. A rate within a stage is no better a guide (its fractions come in bursts): the seconds are shown."""
from __future__ import annotations

import time
from typing import Callable, TextIO

TICK_S = 1.0  # how often the seconds are redrawn while no progress comes


class LoadBar:
    """tqdm's bar, drawn with the stage's own seconds; off where `file` is no terminal (unless `enabled`)."""

    def __init__(self, file: TextIO, clock: Callable[[], float] = time.monotonic, enabled: bool | None = None):
        from tqdm import tqdm

        self.clock = clock
        self.stage, self.fraction, self.started, self.drawn = "", 0.0, clock(), ("", -1)
        self.shown = file.isatty() if enabled is None else enabled  # on a terminal
        self.bar = tqdm(total=100, desc=stage_text("", 0), file=file, leave=False, disable=not self.shown,
                        bar_format="{desc}{percentage:3.0f}%|{bar}|")

    def show(self, stage: str, fraction: float) -> None:
        """The load's stage and fraction as its events tell them."""
        if stage != self.stage:
            self.stage, self.started = stage, self.clock()
        self.fraction = fraction
        self.tick()

    def tick(self) -> None:
        """Redraws the line: its seconds go on while the stage says nothing."""
        line = (stage_text(self.stage, self.clock() - self.started), int(self.fraction * 100))
        if line == self.drawn:  # a load sends hundreds of events: the terminal is written when the line changes
            return
        self.drawn = line
        self.bar.set_description(line[0], refresh=False)
        self.bar.n = line[1]
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def stage_text(stage: str, seconds: float) -> str:
    return f"{stage or 'Loading'} · {int(seconds)} s"
