"""Changes held back while another program holds parley.db's write lock: their file and what the user is told."""
from __future__ import annotations

import sqlite3

import pytest

from app.core import schema
from app.core.sqlite_store import SqliteConversationStore


@pytest.fixture(autouse=True)
def short_busy_wait(monkeypatch):
    monkeypatch.setattr(schema, "BUSY_TIMEOUT_MS", 50)  # each locked try waits this long (2 s in the app)


def _locked_by_a_browser(path) -> sqlite3.Connection:
    """A database browser with an edit not yet written: it holds the write lock until rolled back."""
    browser = sqlite3.connect(path, isolation_level=None)
    browser.execute("BEGIN IMMEDIATE")
    return browser


@pytest.mark.parametrize("renames, said", [(1, "1 change not yet saved is kept"), (2, "2 changes not yet saved are kept")])
def test_the_quit_notice_counts_one_change_in_the_singular(tmp_path, renames, said):
    """The box at quit read '1 changes not yet saved are kept' while the start's line said '1 change'."""
    path = tmp_path / "parley.db"
    store = SqliteConversationStore(path)
    convs = [store.create(f"chat {i}") for i in range(renames)]
    browser = _locked_by_a_browser(path)
    try:
        for conv in convs:
            store.update(conv.id, title="renamed while locked")
        store.close()
    finally:
        browser.close()
    assert f"locked: {said} in parley.db.held.json" in store.notice, store.notice
