"""PromptWorkers: render and tokenise turns' prompts off the engine thread.

A chat template and a tokenizer run on input nobody has bounded yet (a pasted book, a hostile template);
done on the engine thread they would stall every other chat's stream. Daemon threads, so a prompt that
never finishes cannot keep the process from exiting.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

Done = Callable[[Any, BaseException | None], None]


class PromptWorkers:
    def __init__(self, threads: int = 2, name: str = "parley-prompt"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(threads)]
        self._started = False
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], Any], done: Done) -> None:
        """Runs job() on a worker; done(result, None) or done(None, exception) is called there."""
        with self._lock:
            if not self._started:
                self._started = True
                for t in self._threads:
                    t.start()
        self._jobs.put((job, done))

    def close(self, wait: float = 2.0) -> None:
        """Lets idle workers exit and waits up to `wait` seconds for them: a process exiting while a worker thread
        still unwinds aborts ("terminate called without an active exception"). One busy with a runaway job is
        left to end with the process (daemon)."""
        for _ in self._threads:
            self._jobs.put(None)
        if not self._started:
            return
        deadline = time.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, done = item
            try:
                result = job()
            except BaseException as exc:  # noqa: BLE001 - handed to the turn it belongs to
                done(None, exc)
            else:
                done(result, None)
            item = job = done = result = None  # an idle worker must not keep its last turn (and through it a model's cache) alive
