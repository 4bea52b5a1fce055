"""An import shows its chats as they land: the sidebar heard of them only once the last was in (3,000 chats into the
chat database: 2-5 s of 'Importing N of 3,000' over a list without them), now every SHOW_S, in an event-loop turn of
its own (a sidebar of 3,000-5,000 chats: 3-4 ms, painted; not once a slice, which would lengthen each slice's gap)."""
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


def test_showing_them_is_a_turn_of_its_own_between_two_slices(qtbot, tmp_path, monkeypatch):
    """Shown on a 0 ms timer armed inside a slice, the refresh ran back to back with the next slice in one pass of the
    event loop, nothing painted between (a 3,000-chat import in the app: 46-51 ms gaps, 31 ms now)."""
    from PySide6.QtCore import QTimer

    monkeypatch.setattr(persist_ui, "SHOW_S", 0.0)  # a show after every slice
    source = tmp_path / "all.json"
    source.write_text(export.export_json(_store(150)), encoding="utf-8")
    store = SqliteConversationStore(tmp_path / "parley.db")
    order = []
    service = types.SimpleNamespace(store=store, conversations_changed=types.SimpleNamespace(
        emit=lambda: (order.append("show"), time.sleep(0.02))))  # a sidebar of thousands of chats
    window = QMainWindow()
    qtbot.addWidget(window)
    ui = persist_ui.PersistenceUI(window, service)
    real = persist_ui.PersistenceUI._add_slice
    monkeypatch.setattr(persist_ui.PersistenceUI, "_add_slice",
                        lambda self, deadline=None: (order.append("slice"), real(self, deadline)))
    ticker = QTimer(interval=5)  # what a paint or a key press waits behind
    ticker.timeout.connect(lambda: order.append("tick"))
    ticker.start()
    got = []
    ui.import_from(source, got.append)
    qtbot.waitUntil(lambda: bool(got), timeout=30_000)
    ticker.stop()
    assert len(got[0]) == 150
    shows = [i for i, what in enumerate(order) if what == "show"]
    assert len(shows) >= 3
    for at in shows[:-1]:  # the last comes with the import's end
        before = order[max(i for i in range(at) if order[i] == "slice") + 1:at]
        after = order[at + 1:order.index("slice", at)]
        assert "tick" in before and "tick" in after, order[at - 3:at + 4]  # the slice, the show: each a turn
    store.close()
