"""Export and import of many chats keep the window answering: File > Export all chats made and wrote its text on the
GUI thread (1,000 chats of 8,000-character answers: 0.4-0.6 s frozen), an import read, parsed and added it there."""
from __future__ import annotations

import threading
import types

import pytest

from app.core import export
from app.core.conversations import ConversationStore
from tests.app.test_gui_stalls import Heartbeat

CHATS, ANSWER = 1000, "word " * 1600
# Markdown: 229-231 ms frozen to export them on the GUI thread, 288-299 ms to import; 21-49 ms now on a loaded 2-core
# machine, but 222 ms once inside a whole CI run: the gap is only a guard against the seconds-long freezes of before; that
# the work runs on the worker is checked by the thread it runs on. JSON: its export 172-216 ms -> 117-146 ms -> 38-41 ms
# (a store in memory is read here, ~35 us a chat; a database is read on the worker: test_export_snapshot.py), its import
# 576 -> 136-193 ms (json.loads) -> 16 ms, parsed a message at a time (test_import_in_pieces.py)
MAX_GAP_MS = {"md": 1000, "json": 1000}


@pytest.fixture
def worker_only(monkeypatch):
    """Records the threads export's text was made on and an import's file read on: the GUI thread must be in neither."""
    threads = []
    for name in ("markdown_pieces", "json_pieces", "read_chats"):
        real = getattr(export, name)

        def recorded(*args, real=real, **kwargs):
            threads.append(threading.current_thread())
            return real(*args, **kwargs)
        monkeypatch.setattr(export, name, recorded)
    return threads


def _store(n: int) -> ConversationStore:
    store = ConversationStore()
    for i in range(n):
        conv = store.create(f"Chat {i}")
        question = store.add_message(conv.id, None, "user", f"question {i}")
        store.add_message(conv.id, question.id, "assistant", ANSWER + str(i))
    return store


def _ui(qtbot, store: ConversationStore):
    from PySide6.QtWidgets import QMainWindow

    from app.qt.persist_ui import PersistenceUI

    window = QMainWindow()
    qtbot.addWidget(window)
    changed = []
    service = types.SimpleNamespace(store=store, conversations_changed=types.SimpleNamespace(emit=lambda: changed.append(1)))
    ui = PersistenceUI(window, service)
    window.show()
    return window, ui, changed


@pytest.mark.parametrize("fmt", ["md", "json"])
def test_exporting_many_chats_keeps_the_window_answering(qtbot, tmp_path, fmt, worker_only):
    store = _store(CHATS)
    window, ui, _ = _ui(qtbot, store)
    path = tmp_path / f"all.{fmt}"
    with Heartbeat() as beat:
        ui.export_to(path, None, fmt)
        store.append_text(store.path(store.conversations()[0].id)[-1].id, " written after the export began")
        assert "Exporting 1,000 chats" in window.statusBar().currentMessage()
        qtbot.waitUntil(lambda: not ui.busy(), timeout=30_000)
    assert MAX_GAP_MS[fmt] is None or beat.longest < MAX_GAP_MS[fmt], f"the window froze {beat.longest:.0f} ms"
    assert window.statusBar().currentMessage() == f"Exported 1,000 chats to {path}"
    text = path.read_text(encoding="utf-8")
    assert "written after" not in text and text.count("question ") == CHATS  # the chats as they were at the click
    imported, store = [], ConversationStore()  # into the store they came from, each is there already
    # the first UI filters its window's events while qtbot keeps the window: collected with its name, it raised in
    # every event the window got after (AttributeError, a failure in a CI run)
    exporter = ui  # noqa: F841
    window, ui, _ = _ui(qtbot, store)
    with Heartbeat() as beat:
        ui.import_from(path, imported.append)
        qtbot.waitUntil(lambda: bool(imported), timeout=30_000)
    assert MAX_GAP_MS[fmt] is None or beat.longest < MAX_GAP_MS[fmt], f"the window froze {beat.longest:.0f} ms"
    assert len(imported[0]) == CHATS and window.statusBar().currentMessage() == f"Imported 1,000 chats from {path}"
    assert len(worker_only) == 2 and threading.main_thread() not in worker_only  # the text made, the file read
    assert [m.content for m in store.path(imported[0][-1])] == ["question 0", ANSWER + "0"]  # the sidebar's order: oldest last


def test_closing_the_window_mid_export_and_mid_import_loses_neither(qtbot, tmp_path):
    store = _store(200)
    source = tmp_path / "in.json"
    source.write_text(export.export_json(_store(300)), encoding="utf-8")
    window, ui, changed = _ui(qtbot, store)
    ui.export_to(tmp_path / "a.md", None, "md")
    ui.import_from(source)
    ui.export_to(tmp_path / "a.md", [store.conversations()[0].id], "md")  # again, over the first: the later stays
    ui.import_from(tmp_path / "missing.json")
    assert ui.busy()
    window.close()
    assert not ui.busy() and changed == [1] and len(store.conversations()) == 500
    assert (tmp_path / "a.md").read_text(encoding="utf-8").count("<!-- parley:user -->") == 1
    assert not list(tmp_path.glob("*.partial"))


def test_a_failed_export_or_import_says_so_and_no_longer_says_it_is_at_work(qtbot, tmp_path):
    window, ui, _ = _ui(qtbot, _store(3))
    warned = []
    ui._warn = lambda title, text: warned.append(title)
    ui.export_to(tmp_path / "no such folder" / "a.md", None, "md")
    ui.import_from(tmp_path / "missing.json")
    qtbot.waitUntil(lambda: not ui.busy(), timeout=10_000)
    assert warned == ["Export failed", "Import failed"] and window.statusBar().currentMessage() == ""
