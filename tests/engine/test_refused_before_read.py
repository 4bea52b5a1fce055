"""A model that cannot fit is refused before its weights are read, under a real memory limit (RLIMIT_AS, as
`ulimit -v` sets it) in one subprocess: through the engine API the app loads with, `parley generate` and `parley serve`.
Each limit leaves room for the model's weights but not for them and what its runtime adds (cache, tapes, steps)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import gc, io, json, resource, sys, time
from contextlib import redirect_stderr, redirect_stdout
import psutil, torch
import cli.serve, cli.terminal, engine.engine, server.app, server.bridge, server.run
import engine.loading.loader as loader
from cli.main import main
from engine import events as ev
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from kernels.cpu_native import cpu_kernel
from tests.support.engine_client import Client

big, small, home = sys.argv[1:4]
cpu_kernel()  # built (or found) before any limit: a build is not what is measured
reads = []
read = loader.read_gguf_weights
loader.read_gguf_weights = lambda gf, *a, **k: reads.append(gf.path.name) or read(gf, *a, **k)


def settled_vms():  # an engine's threads unmap their stacks and arenas a moment after shutdown: wait them out
    proc, last, same, deadline = psutil.Process(), None, 0, time.monotonic() + 10
    while same < 5 and time.monotonic() < deadline:
        gc.collect()
        now = (proc.num_threads(), proc.memory_info().vms)
        same, last = (same + 1 if now == last else 0), now
        time.sleep(0.1)
    return last[1]


def limit(room_mb):  # this much address space past what the process maps now
    vms = settled_vms()
    resource.setrlimit(resource.RLIMIT_AS, (vms + room_mb * 2**20, resource.RLIM_INFINITY))


def load(client, path):
    start, model_id = time.perf_counter(), client.engine.load_model(path)
    done = client.wait_for(lambda e: isinstance(e, (ev.ModelLoaded, ev.ModelFailed)) and e.model_id == model_id, 300)
    return done, model_id, time.perf_counter() - start


client = Client(EngineConfig(max_sessions=64, max_session_tokens=1024, device="cpu"))  # the app's way in
client.engine.start()
limit(750)
failed, _, took = load(client, big)
loaded, model_id, _ = load(client, small)  # a smaller model, in the same engine, under the same limit
answer = client.wait(client.send(client.open(model_id, SamplingParams(max_tokens=4)), "hi"))
client.engine.shutdown()
print(json.dumps(dict(case="engine", message=getattr(failed, "message", type(failed).__name__), seconds=took,
                      reads=reads, then=type(loaded).__name__, answer=type(answer).__name__)))
client = Client(EngineConfig(max_sessions=1, max_session_tokens=1024, device="cpu"))
client.engine.start()
limit(750)  # just above what one chat's drafting answer took (~0.65 GB)
loaded, model_id, _ = load(client, big)
params = SamplingParams(max_tokens=24, temperature=0.7, seed=1)
answer = client.wait(client.send(client.open(model_id, params), "one two three " * 20), 300)
client.engine.shutdown()
print(json.dumps(dict(case="fits", loaded=getattr(loaded, "message", type(loaded).__name__),
                      answer=getattr(answer, "message", type(answer).__name__))))
for case, room, argv in [("generate", 450, ["generate", "--model", big, "--prompt", "hi", "--max-tokens", "2"]),
                         ("serve", 750, ["serve", "--port", "0", "--model", big, "--max-sessions", "64"])]:
    reads.clear()
    err, out = io.StringIO(), io.StringIO()  # an answer printed would hide the JSON lines: kept for the assertion
    limit(room)
    start = time.perf_counter()
    with redirect_stderr(err), redirect_stdout(out):
        code = main(["--data-dir", home, *argv])
    print(json.dumps(dict(case=case, code=code, seconds=time.perf_counter() - start, reads=reads, stderr=err.getvalue(),
                     stdout=out.getvalue())))
"""
NEEDS = re.compile(r"gemma3\.gguf needs ~(?P<need>\d\.\d+) GB \(weights (?P<weights>0\.\d+), a cache for (?P<chats>\d+) "
                   r"chats? [\d.]+, decode tapes [\d.]+, a step's activations [\d.]+ GB\), (?P<free>\d\.\d+) GB free "
                   r"under this process's memory limit \(ulimit -v\)\.")


@pytest.fixture(scope="module")
def limited(gemma_gguf_path, tiny_models_q8, tmp_path_factory) -> dict[str, dict]:
    """Each case's outcome: one process for all three (torch's import is most of its time)."""
    home = tmp_path_factory.mktemp("home")
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PARLEY_HOME": str(home), "OMP_NUM_THREADS": "2"}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(gemma_gguf_path), str(tiny_models_q8["llama"].gguf_path),
                          str(home)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    return {case["case"]: case for case in map(json.loads, run.stdout.strip().splitlines())}


def _refused_for_the_whole(message: str, chats: int) -> None:
    """The one line names what needs what; the weights alone would have fit, the whole does not."""
    m = NEEDS.fullmatch(message.removeprefix("parley: ").strip())
    assert m, message
    assert int(m["chats"]) == chats
    assert float(m["weights"]) < float(m["free"]) < float(m["need"]), message


def test_the_app_s_load_refuses_before_reading_and_the_engine_goes_on(limited):
    """64 chats of the embedded model with 750 MB to map: its weights (0.39 GB) fit; they, its first cache for 64 chats
    (0.35 GB), its tapes and a step do not. The load read the whole file, then refused for the cache; now it is
    refused from the header (0.3 s here), no weight read, and a smaller model loads and answers after."""
    case = limited["engine"]
    assert case["reads"] == ["llama-q8_0.gguf"], case  # the small model's, only
    _refused_for_the_whole(case["message"], 64)
    assert (case["then"], case["answer"]) == ("ModelLoaded", "Finished"), case


def test_parley_generate_refuses_before_reading(limited):
    """`parley generate` with 450 MB to map: it read the file, then its answer failed mid-way ('Generation failed:
    RuntimeError(... can't allocate memory ...)'); now the one line and exit 2, before any weight is read."""
    case = limited["generate"]
    assert case["code"] == 2 and case["reads"] == [], case
    _refused_for_the_whole(case["stderr"], 1)


def test_parley_serve_refuses_at_its_start(limited):
    """`parley serve` loads its models before it listens: 64 chats with 750 MB to map are refused there, in one
    line, and it exits 2 without listening."""
    case = limited["serve"]
    assert case["code"] == 2 and case["reads"] == [] and "listening" not in case["stderr"], case
    _refused_for_the_whole(case["stderr"], 64)


def test_the_embedded_model_with_room_just_above_its_need_is_not_refused(limited):
    """The margin is honest: one chat of the embedded model with 750 MB to map (a 200-token answer that drafts took
    ~0.65 GB: it failed with 596 MB free, ran with 646) loads and answers."""
    assert (limited["fits"]["loaded"], limited["fits"]["answer"]) == ("ModelLoaded", "Finished"), limited["fits"]
