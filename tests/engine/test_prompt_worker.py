"""Prompt workers when their threads cannot start: the turn's prompt still renders, and closing them raises nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# each worker's stack asks 256 MB of address space; the limit leaves room for `stacks_room` of them
SCRIPT = """
import resource, threading, time
from engine.prompt_worker import PromptWorkers
threading.stack_size(256 << 20)
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + int({stacks_room} * (256 << 20)) + (64 << 20), resource.RLIM_INFINITY))
workers, out = PromptWorkers(threads=2), []
workers.submit(lambda: 6 * 7, lambda result, exc: out.append((result, exc, threading.current_thread().name)))
end = time.monotonic() + 10
while not out and time.monotonic() < end:
    time.sleep(0.01)
workers.close()
print(out[0][0], out[0][1], out[0][2].startswith("parley-prompt"))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and an address-space limit")
@pytest.mark.parametrize("stacks_room, on_a_worker", [(0.5, False), (1.5, True)])
def test_a_turn_renders_where_worker_threads_cannot_start(stacks_room, on_a_worker):
    """Under `ulimit -v`, the first request's workers failed to start ("can't start new thread"): the turn failed with
    an internal error, and closing the engine raised "cannot join thread before it is started"."""
    run = subprocess.run([sys.executable, "-c", SCRIPT.format(stacks_room=stacks_room)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["42", "None", str(on_a_worker)]
