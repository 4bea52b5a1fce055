"""parley.db's -shm or -wal made immutable while Parley runs (chattr +i): a write into the mapped -shm killed the
process with SIGBUS, and a -wal that could not be written lost every later change at quit. Now the changes are held,
the window says which file, and they are kept beside the database at quit and saved at the next start."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.core.sqlite_store import SqliteConversationStore

ROOT = Path(__file__).resolve().parents[2]
CHILD = textwrap.dedent("""
    import subprocess, sys
    from app.core.sqlite_store import SqliteConversationStore
    db, suffix = sys.argv[1], sys.argv[2]
    store = SqliteConversationStore(db)
    chat = store.create("kept")
    subprocess.run(["chattr", "+i", db + suffix], check=True)
    msg = store.add_message(chat.id, None, "user", "hello")
    for _ in range(40):
        store.append_text(msg.id, "y" * 50)
        store.flush()
    print(store.warning, flush=True)
    store.close()
    print(store.notice, flush=True)
""")


NEXT_START = textwrap.dedent("""
    import sys
    from app.core.sqlite_store import SqliteConversationStore
    print(SqliteConversationStore(sys.argv[1]).notice, flush=True)
""")


def _chattr_works(folder: Path) -> bool:
    probe = folder / "probe"
    probe.write_text("")
    ok = subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["chattr", "-i", str(probe)], check=True)
    return ok


@pytest.mark.parametrize("suffix", ["-shm", "-wal"])
def test_a_side_file_made_immutable_loses_nothing(tmp_path, suffix):
    if sys.platform != "linux" or not _chattr_works(tmp_path):
        pytest.skip("needs chattr +i (root, on a file system that keeps the flag)")
    db = tmp_path / "parley.db"
    try:
        run = subprocess.run([sys.executable, "-c", CHILD, str(db), suffix], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        if suffix == "-wal":  # the next start, the file still immutable (the same words for -shm)
            again = subprocess.run([sys.executable, "-c", NEXT_START, str(db)], cwd=ROOT, capture_output=True,
                                   text=True, timeout=60).stdout.strip()
    finally:
        subprocess.run(["chattr", "-i", f"{db}{suffix}"], capture_output=True)
    assert run.returncode == 0, run.stderr[-2000:]
    warning, notice = run.stdout.splitlines()
    assert warning.startswith(f"{db}{suffix} cannot be written (made read-only or immutable)")
    assert notice.startswith(f"parley.db{suffix} could not be written:")
    # the next starts said 'held back when Parley last ran (another program had parley.db locked)' and, while the
    # file was still immutable, '… shown and saved once it lets go': a program that never was
    held = f"held back when Parley last ran (parley.db{suffix} could not be written) are"
    assert suffix == "-shm" or held in again and again.endswith(
        f"shown, and saved once parley.db{suffix} can be written again (it is read-only or immutable: chattr -i clears "
        "that)."), again
    store = SqliteConversationStore(db)
    assert f"{held} saved now." in store.notice
    (chat,) = store.conversations()
    (msg,) = store.path(chat.id)
    assert chat.title == "kept" and msg.content == "hello" + "y" * 50 * 40
    store.close()
