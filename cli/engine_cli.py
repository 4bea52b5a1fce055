"""A blocking client of the engine thread for the command line: load, run turns, stream text."""
from __future__ import annotations

import queue
import sys
from typing import Callable

from engine import events as ev
from engine.engine import Engine
from engine.errors import ModelLoadError, ParleyError
from engine.runtime import EngineConfig


class EngineCLI:
    def __init__(self, config: EngineConfig):
        self.engine = Engine(config).start()
        self.tokens: dict[int, list[int]] = {}
        self.ended: dict[int, ev.Event] = {}
        self.dropped: dict[int, int] = {}  # per session: the oldest messages its last turn left out (`truncate`)
        self.hints: dict[str, str] = {}  # an error's code -> what the user can do about it, after its message

    def close(self) -> None:
        self.engine.shutdown()

    def load(self, source, progress: Callable[[str, float], None] | None = None,
             idle: Callable[[], None] | None = None, idle_s: float = 1.0) -> tuple[int, ev.ModelLoaded]:
        """Loads `source`; progress(stage, fraction) for each progress event, idle() each `idle_s` without one."""
        model_id = self.engine.load_model(source)
        while True:
            try:
                e = self.engine.events.get(timeout=idle_s if idle else None)
            except queue.Empty:
                idle()
                continue
            if isinstance(e, ev.ModelProgress) and progress:
                progress(e.stage, e.fraction)
            elif isinstance(e, ev.ModelFailed) and e.model_id == model_id:
                raise ModelLoadError(e.message)
            elif isinstance(e, ev.ModelLoaded) and e.model_id == model_id:
                return model_id, e

    def run(self, turns: list[int], on_text: Callable[[int, str], None] | None = None) -> None:
        """Pumps events until every turn in `turns` has finished; on_text(turn, text) streams deltas."""
        pending = set(turns) - self.ended.keys()
        while pending:
            e = self.engine.events.get()
            turn = getattr(e, "turn_id", None)
            if isinstance(e, ev.TokenDelta):
                self.tokens.setdefault(turn, []).extend(e.token_ids)
                if on_text and e.text:
                    on_text(turn, e.text)
            elif isinstance(e, ev.ContextUsage):
                self.dropped[e.session_id] = e.dropped_messages
            elif isinstance(e, (ev.Finished, ev.Error)) and turn is not None:
                self.ended[turn] = e
                pending.discard(turn)
            elif isinstance(e, ev.Error):
                print(f"parley: {e.message}", file=sys.stderr)

    def error(self, turn: int) -> str | None:
        """The message of a turn that ended in an error; None where it finished."""
        end = self.ended.get(turn)
        return end.message + self.hints.get(end.code, "") if isinstance(end, ev.Error) else None

    def result(self, turn: int) -> ev.Finished:
        end = self.ended[turn]
        if isinstance(end, ev.Error):
            raise ParleyError(end.message)
        return end
