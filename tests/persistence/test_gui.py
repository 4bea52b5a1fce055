"""The app on the SQLite store: chats survive a restart, interrupted answers offer Continue, warnings, export/import."""
from __future__ import annotations

import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before any Qt import

import pytest

from app.core.message_html import message_html
from app.core.sqlite_store import SqliteConversationStore
from engine.runtime import EngineConfig
from tests.app.helpers import configure, wait_idle

TINY_ENGINE = dict(max_sessions=4, max_session_tokens=512, step_tokens=64, chunk_tokens=32)


@pytest.fixture
def start(qtbot, qapp, tiny_models):
    apps = []

    def start(data_dir):
        from app.qt.main import build

        app = build(str(data_dir), default_model=str(tiny_models["qwen3"].gguf_path),
                    engine=EngineConfig(**TINY_ENGINE), theme="light", show=False)
        qtbot.addWidget(app.window)
        qtbot.waitUntil(lambda: app.models.model_id("default") is not None, timeout=60_000)
        apps.append(app)
        return app

    yield start
    for app in apps:
        app.bridge.shutdown()
        app.store.close()


def test_chats_survive_a_restart_and_search_finds_them(start, qtbot, tmp_path):
    app = start(tmp_path)
    conv = app.window.current()
    configure(app, conv, max_tokens=6, temperature=0.0)
    assert app.service.send(conv, "Remember the word pelican")
    wait_idle(app, qtbot, conv)
    before = [(m.role, m.content, m.state) for m in app.store.path(conv)]
    app.close()

    again = start(tmp_path)
    assert again.window.current() == conv  # the latest chat opens
    assert [(m.role, m.content, m.state) for m in again.store.path(conv)] == before
    again.window.sidebar.search.setText("pelican")  # looked for on a worker
    qtbot.waitUntil(lambda: again.window.sidebar.ids() == [conv])
    assert not again.extra["persistence"].warning.isVisible()


def test_interrupted_answer_offers_continue_and_regenerate(start, qtbot, tmp_path):
    store = SqliteConversationStore(tmp_path / "parley.db")
    conv = store.create("Cut off")
    user = store.add_message(conv.id, None, "user", "Tell me a story")
    store.add_message(conv.id, user.id, "assistant", "Once upon a", state="streaming")
    del store  # the app died here

    app = start(tmp_path)
    answer = app.store.path(conv.id)[-1]
    assert answer.state == "interrupted" and answer.content == "Once upon a"
    html = message_html(answer, 1, 1, app.window.chat.view.delegate.renderer, busy=False).html
    assert "Interrupted" in html and 'href="continue:"' in html and 'href="regen:"' in html
    configure(app, conv.id, max_tokens=4, temperature=0.0)
    app.window.chat.view.activate(answer, "continue:")
    wait_idle(app, qtbot, conv.id)
    path = app.store.path(conv.id)
    assert [m.role for m in path] == ["user", "assistant"] and path[-1].id == answer.id  # grown in place
    assert path[-1].state == "done" and path[-1].content.startswith("Once upon a")
    assert len(path[-1].content) > len("Once upon a") and path[-1].stats["completion_tokens"] == 4
    html = message_html(path[-1], 1, 1, app.window.chat.view.delegate.renderer, busy=False).html
    assert 'href="continue:"' in html  # cut short by max tokens: it can go on again
    app.window.chat.view.activate(answer, "regen:")
    wait_idle(app, qtbot, conv.id)
    assert len(app.store.versions(answer)) == 2


def test_unwritable_database_is_reported_and_chat_still_works(start, qtbot, tmp_path):
    (tmp_path / "parley.db").mkdir()  # something that is not a database file stands in the way
    app = start(tmp_path)
    ui = app.extra["persistence"]
    assert not app.store.persistent and not ui.warning.isHidden() and "cannot be saved" in ui.warning.toolTip()
    assert ui.warning.text() == "⚠ Not saving chats"
    conv = app.window.current()
    configure(app, conv, max_tokens=3, temperature=0.0)
    assert app.service.send(conv, "hi")
    wait_idle(app, qtbot, conv)
    assert app.store.path(conv)[-1].state == "done"


def test_a_damaged_database_set_aside_is_reported_as_replaced_not_as_unsaved(start, tmp_path):
    (tmp_path / "parley.db").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 40)
    app = start(tmp_path)
    ui = app.extra["persistence"]
    assert app.store.persistent and ui.warning.text() == "⚠ Chat database replaced"
    assert "damaged" in ui.warning.toolTip() and list(tmp_path.glob("parley.db.damaged-*"))


def test_export_and_import_from_the_window(start, tmp_path):
    app = start(tmp_path / "data")
    conv = app.window.current()
    user = app.store.add_message(conv, None, "user", "hello there")
    answer = app.store.add_message(conv, user.id, "assistant", "general")
    ui = app.extra["persistence"]
    ui.export_to(tmp_path / "all.json", None, "json")
    ui.export_to(tmp_path / "one.md", [conv], "md")
    ui.finish()
    assert "hello there" in (tmp_path / "one.md").read_text()
    app.store.append_text(answer.id, " Kenobi")  # changed since the export: its exported copy is another chat
    got = []
    ui.import_from(tmp_path / "all.json", got.append)
    ui.finish()
    ids = got[0]
    assert len(ids) == 1 and [m.content for m in app.store.path(ids[0])] == ["hello there", "general"]
    assert ids[0] in app.window.sidebar.ids()
    (tmp_path / "bad.json").write_text("[" * 10_000)
    ui.import_from(tmp_path / "bad.json", got.append)
    ui.finish()
    assert got[1] == [] and "Import failed" in app.window.last_warning.windowTitle()
    assert [a.text() for a in ui.menu.actions()] == ["Export this chat…", "Export all chats…", "Import chats…"]


def test_the_not_saving_warning_goes_once_the_store_writes_again(qtbot):
    from PySide6.QtWidgets import QMainWindow
    import types

    from app.core.conversations import ConversationStore
    from app.qt.persist_ui import PersistenceUI

    window = QMainWindow()
    qtbot.addWidget(window)
    ui = PersistenceUI(window, types.SimpleNamespace(store=ConversationStore()))
    window.show()
    ui.show_warning("Another program has parley.db locked: chats are not saved until it lets go.")
    assert ui.warning.isVisible()
    ui.show_warning("")
    assert not ui.warning.isVisible() and window.statusBar().currentMessage() == "Chats are saved again."


def test_the_window_says_what_the_last_quit_kept_back_was_merged(qtbot, tmp_path):
    """Changes a lock held back at the last quit are merged at the start: the status bar says so (it said nothing)."""
    from PySide6.QtWidgets import QMainWindow
    import types

    from app.core.held_changes import save_held
    from app.qt.persist_ui import PersistenceUI

    path = tmp_path / "parley.db"
    store = SqliteConversationStore(path)
    conv = store.create("one")
    store.close()
    save_held(path, [("UPDATE conversation SET title = ? WHERE id = ?", ("renamed while locked", conv.id))],
              why="another program had parley.db locked")  # as the store writes it
    store = SqliteConversationStore(path)
    window = QMainWindow()
    qtbot.addWidget(window)
    PersistenceUI(window, types.SimpleNamespace(store=store))
    assert store.get(conv.id).title == "renamed while locked"
    assert window.statusBar().currentMessage() == "1 change held back when Parley last ran (another program had " \
                                                  "parley.db locked) is saved now."
    store.close()


def test_the_window_says_once_which_settings_did_not_read(start, tmp_path, capsys):
    """A settings value that did not read was left at its default without a word (and written over at the next save)."""
    import sqlite3

    (tmp_path / "settings.json").write_text('{"defaults": {"max_tokens": "lots"}}')
    store = SqliteConversationStore(tmp_path / "parley.db")
    conv = store.create("Trip")
    store.close()
    with sqlite3.connect(tmp_path / "parley.db") as db:
        db.execute("UPDATE conversation SET settings_json = ? WHERE id = ?", ('{"top_k": -4}', conv.id))
    app = start(tmp_path)
    said = "settings.json: 1 value did not read and is left at the default: defaults.max_tokens"
    shown, err = app.window.statusBar().currentMessage(), capsys.readouterr().err
    assert shown.startswith(said) and said in err
    assert "Settings of 1 chat did not read" in shown and "“Trip”: top_k -4" in err
    assert list(tmp_path.glob("settings.json.damaged-*"))  # the model's "loaded" line did not wipe it either
