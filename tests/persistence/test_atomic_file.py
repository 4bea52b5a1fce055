"""Exports and settings are written whole or not at all: a failed write keeps the old file as it was."""
import subprocess
import sys
import textwrap
from pathlib import Path

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
        print(ui.export_to({str(old)!r}, None, "md"))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["Export", "failed", "False"], run.stderr
    assert old.read_text(encoding="utf-8") == "# Old export\n" * 40
