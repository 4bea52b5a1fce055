"""An import shows its chats as they land: the sidebar heard of them only once the last was in (3,000 chats into the
chat database: 2-5 s of 'Importing N of 3,000' over a list without them), now every SHOW_S, in an event-loop turn of
its own (a sidebar of 3,000 chats refreshes in ~15 ms: not once a slice, which would double each slice's gap)."""
from __future__ import annotations

import time
import types

from PySide6.QtWidgets import QMainWindow

from app.core import export
from app.core.sqlite_store import SqliteConversationStore
from app.qt import persist_ui
from tests.persistence.test_export_in_background import _store

CHATS = 400


def test_an_import_shows_its_chats_as_they_land(qtbot, tmp_path, monkeypatch):
    monkeypatch.setattr(persist_ui, "SHOW_S", 0.05)
    source = tmp_path / "all.json"
    source.write_text(export.export_json(_store(CHATS)), encoding="utf-8")
    store = SqliteConversationStore(tmp_path / "parley.db")
    shown = []  # the chats the window had when it was told
    service = types.SimpleNamespace(store=store, conversations_changed=types.SimpleNamespace(
        emit=lambda: shown.append(len(store.conversations()))))
    window = QMainWindow()
    qtbot.addWidget(window)
    ui = persist_ui.PersistenceUI(window, service)
    got = []
    start = time.monotonic()
    ui.import_from(source, got.append)
    qtbot.waitUntil(lambda: bool(got), timeout=30_000)
    took = time.monotonic() - start
    assert len(got[0]) == CHATS and shown[-1] == CHATS
    assert len(shown) >= 2 and 0 < shown[0] < CHATS  # some shown before the last landed
    assert shown == sorted(shown)
    assert len(shown) <= took / persist_ui.SHOW_S + 3  # every SHOW_S at most, not every slice
    store.close()
