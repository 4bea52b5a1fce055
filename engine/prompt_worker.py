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
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], Any], done: Done) -> None:
        """Runs job() on a worker; done(result, None) or done(None, exception) is called there. Where no worker thread
        can start (the address space or the thread limit spent), it runs here instead: late, rather than a lost turn."""
        if self._running():
            self._jobs.put((job, done))
        else:
            _run(job, done)

    def close(self, wait: float = 2.0) -> None:
        """Lets idle workers exit and waits up to `wait` seconds for them: a process exiting while a worker thread
        still unwinds aborts ("terminate called without an active exception"). One busy with a runaway job is
        left to end with the process (daemon)."""
        started = [t for t in self._threads if t.ident is not None]
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + wait
        for t in started:
            t.join(max(0.0, deadline - time.monotonic()))

    def _running(self) -> bool:
        """Starts the workers not yet running (each submit tries again those that could not start); any running?"""
        with self._lock:
            for t in self._threads:
                if t.ident is None:
                    try:
                        t.start()
                    except RuntimeError:  # "can't start new thread": those started serve, or none and the caller does
                        break
            return any(t.ident is not None for t in self._threads)

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            _run(*item)
            item = None  # an idle worker must not keep its last turn (and through it a model's cache) alive


def _run(job: Callable[[], Any], done: Done) -> None:
    try:
        result = job()
    except BaseException as exc:  # noqa: BLE001 - handed to the turn it belongs to
        done(None, exc)
    else:
        done(result, None)
