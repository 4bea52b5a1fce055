"""Exports and settings are written whole or not at all: a failed write keeps the old file as it was."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_write_past_the_file_size_limit_keeps_the_old_export_whole(tmp_path):
    """An export over an earlier one on a full disk left a cut-off new file in its place (the old one lost)."""
    old = tmp_path / "chats.md"
    old.write_text("# Old export\n" * 40, encoding="utf-8")
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from app.core.atomic_file import write_text_whole
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG, as a full disk's with ENOSPC
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        try:
            write_text_whole(Path({str(old)!r}), "# New export\\n" * 400)
        except OSError as exc:
            print(exc.errno)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "27", run.stderr  # EFBIG
    assert old.read_text(encoding="utf-8") == "# Old export\n" * 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.md"]  # no partial copy left beside it


def test_a_linked_file_is_written_where_it_leads(tmp_path):
    from app.core.atomic_file import write_text_whole

    real = tmp_path / "dotfiles" / "export.md"
    real.parent.mkdir()
    real.write_text("old", encoding="utf-8")
    link = tmp_path / "export.md"
    link.symlink_to(real)
    write_text_whole(link, "new")
    assert link.is_symlink() and real.read_text(encoding="utf-8") == "new"


def test_the_apps_export_over_an_earlier_one_that_fails_keeps_the_earlier_one(tmp_path):
    old = tmp_path / "chats.md"
    old.write_text("# Old export\n" * 40, encoding="utf-8")
    script = textwrap.dedent(f"""
        import os, resource, signal, sys, types
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        from PySide6.QtWidgets import QApplication, QMainWindow
        from app.core.conversations import ConversationStore
        from app.qt.persist_ui import PersistenceUI
        app = QApplication([])
        store = ConversationStore()
        store.add_message(store.create("Long").id, None, "user", "word " * 1000)
        ui = PersistenceUI(QMainWindow(), types.SimpleNamespace(store=store))
        ui._warn = lambda title, text: print(title)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        ui.export_to({str(old)!r}, None, "md")
        ui.finish()
        print("done")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["Export", "failed", "done"], run.stderr
    assert old.read_text(encoding="utf-8") == "# Old export\n" * 40


EXT4_IOC_SHUTDOWN, NOLOGFLUSH = 0x8004587D, 2  # <linux/ext4.h>: stop the file system as a power cut would


def _mount(image: Path, at: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"loop,{options}", str(image), str(at)], check=True, capture_output=True)


def test_a_new_file_written_just_before_a_power_cut_is_whole_after_it(tmp_path):
    """Without fsync an export or a first settings.json read back empty after the cut (the rename reached the journal
    before the bytes reached the disk: 3 of 3 on ext4's defaults; 6 of 6, old files too, mounted noauto_da_alloc), or
    missing (the rename not yet in the journal)."""
    import fcntl
    import os
    import shutil
    import struct
    import time

    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("a loop-mounted ext4 needs root and mkfs.ext4")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as out:
        out.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    from app.core.atomic_file import write_text_whole

    text = '{"theme": "dark"}' * 100
    _mount(image, mnt, "commit=1")  # the journal commits the rename within a second
    try:
        write_text_whole(mnt / "settings.json", text)
        time.sleep(1.5)
        fd = os.open(mnt, os.O_RDONLY)
        fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", NOLOGFLUSH))
        os.close(fd)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    _mount(image, mnt, "rw")  # the journal is replayed: what a restart after the cut reads
    try:
        assert (mnt / "settings.json").read_text(encoding="utf-8") == text
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
