"""SIGKILL the store+engine process at random moments: the file stays sound and nothing committed is lost."""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from app.core.sqlite_store import INTERRUPTED, UNFINISHED, SqliteConversationStore

KILLS = 20
ROOT = Path(__file__).resolve().parents[2]


def _committed(side: Path) -> dict[int, tuple[int, int]]:
    """message id -> (length, crc) of the last commit the child reported."""
    out = {}
    for line in side.read_text(encoding="utf-8").splitlines():
        if line.startswith("c "):
            _, mid, length, crc = line.split()
            out[int(mid)] = (int(length), int(crc))
    return out


def _wait_for(side: Path, word: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if side.exists() and word in side.read_text(encoding="utf-8"):
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def zygote(tiny_models):
    proc = subprocess.Popen([sys.executable, "-m", "tests.persistence.crash_child", str(tiny_models["qwen3"].gguf_path)],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


def test_sigkill_mid_answer_loses_nothing_committed(zygote, tmp_path):
    rng = random.Random(1234)
    db = tmp_path / "parley.db"
    all_committed: dict[int, tuple[int, int]] = {}
    mid_stream = 0
    for run in range(KILLS):
        side = tmp_path / f"side-{run}.txt"
        zygote.stdin.write(f"run {db} {side} {run}\n")
        zygote.stdin.flush()
        pid = int(zygote.stdout.readline())
        if rng.random() < 0.25:  # early: while the store opens, recovers or the model loads
            time.sleep(rng.uniform(0, 0.4))
        else:
            assert _wait_for(side, "ready", 60), side.read_text() if side.exists() else "no side file"
            time.sleep(rng.uniform(0.05, 1.0))
            mid_stream += 1
        os.kill(pid, signal.SIGKILL)
        status = zygote.stdout.readline().split()
        assert status[0] == "exit" and os.WIFSIGNALED(int(status[1])), (status, side.read_text())
        all_committed.update(_committed(side) if side.exists() else {})

        raw = sqlite3.connect(db)
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = {mid: content for mid, content in raw.execute("SELECT id, content FROM message")}
        raw.close()
        for mid, (length, crc) in all_committed.items():
            assert mid in rows, f"run {run}: committed message {mid} is missing"
            assert zlib.crc32(rows[mid][:length].encode("utf-8")) == crc, f"run {run}: message {mid} lost text"

        store = SqliteConversationStore(db)  # what the next start sees
        assert store.persistent and not store.warning
        states = {m.state for m in store._messages.values()}
        assert not states & set(UNFINISHED)
        store.close()
    assert mid_stream >= 10
    store = SqliteConversationStore(db)
    interrupted = [m for m in store._messages.values() if m.state == INTERRUPTED]
    assert interrupted and any(m.content for m in interrupted)  # partial answers are kept, marked
    assert len(store.conversations()) >= KILLS
