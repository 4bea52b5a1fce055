"""settings.json, a chat's stored settings and the old models.json as a damaged or hand-edited data folder leaves
them: the app opens with what still reads, keeps what does not aside, and never writes over another Parley's."""
from __future__ import annotations

import json

import pytest

from app.core.app_settings import AppSettings
from app.core.chat_settings import ChatSettings
from app.core.sqlite_registry import SqliteModelRegistry
from app.core.sqlite_store import SqliteConversationStore


@pytest.mark.parametrize("content", [b"null", b"[]", b"5", b"{not json", b'{"theme": "\xff\xfe"}'])
def test_a_file_that_is_not_settings_is_kept_aside_and_defaults_load(tmp_path, content):
    file = tmp_path / "settings.json"
    file.write_bytes(content)
    settings = AppSettings.load(file)
    assert settings.theme == "system" and settings.defaults == ChatSettings() and not file.exists()
    aside = list(tmp_path.glob("settings.json.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content  # the user's bytes, kept
    assert settings.save() and json.loads(file.read_text())["theme"] == "system"


def test_each_value_that_does_not_read_keeps_its_default_and_the_rest_are_kept(tmp_path):
    file = tmp_path / "settings.json"
    file.write_text(json.dumps({
        "theme": 5, "weights": "fp3", "one_at_a_time": "false", "draft_model": 7,
        "defaults": {"temperature": -3, "top_p": 0.5, "max_tokens": "lots", "model": 9, "system_prompt": "Be brief."},
        "window": {"geometry": 5, "sidebar": 99999999999}, "drafts": "x",
        "presets": {"Bad": {"temperature": -1}, "Good": {"temperature": 0.2}, "Odd": "x"}}))
    s = AppSettings.load(file)
    assert (s.theme, s.weights, s.one_at_a_time, s.draft_model, s.window, s.drafts) == ("system", "auto", False, "",
                                                                                       {}, {})
    assert (s.defaults.temperature, s.defaults.top_p, s.defaults.max_tokens) == (ChatSettings().temperature, 0.5,
                                                                                ChatSettings().max_tokens)
    assert s.defaults.model == "default" and s.defaults.system_prompt == "Be brief." and list(s.presets) == ["Good"]


def test_values_that_do_not_read_are_named_once_and_the_file_as_it_was_is_kept_aside(tmp_path):
    """A friend's settings.json with a typo'd theme, a quoted number and a preset out of range: each was dropped
    without a word, and the next save (any theme or draft change) wrote the defaults over the user's values."""
    file = tmp_path / "settings.json"
    given = json.dumps({"theme": "Dark", "defaults": {"temperature": "0.8", "top_p": 0.9},
                        "presets": {"Creative": {"temperature": 1.2, "top_p": 1.5}, "Exact": {"temperature": 0}},
                        "drafts": {"x": "lost"}, "window": {"sidebar": -5}}).encode()
    file.write_bytes(given)
    s = AppSettings.load(file)
    assert (s.theme, s.defaults.temperature, s.defaults.top_p, list(s.presets)) == ("system", 0.7, 0.9, ["Exact"])
    assert [u.split(" ")[0] for u in s.unread] == ["theme", "defaults.temperature", "window.sidebar", "drafts.x",
                                                   "presets.Creative"]
    assert s.notice.startswith("settings.json: 5 values did not read and are left at the defaults: theme 'Dark' "
                               "(one of system, light, dark); defaults.temperature (temperature must be a finite "
                               "number, not '0.8'); window.sidebar -5 (a width from 0 to 65535); and 2 more.")
    assert s.notice.endswith(f"The file as it was is kept as {s.aside.name}.")
    assert s.save() and s.aside.read_bytes() == given and json.loads(file.read_text())["theme"] == "system"
    assert AppSettings.load(file).notice == ""  # said once: what was saved reads
    file.write_bytes(given)
    again = AppSettings.load(file)  # within the same second: the first copy is not written over
    assert again.aside != s.aside and len(list(tmp_path.glob("settings.json.damaged-*"))) == 2


def test_every_value_parley_writes_reads_back_without_a_notice(tmp_path):
    file = tmp_path / "settings.json"
    s = AppSettings(theme="dark", defaults=ChatSettings(seed=2**64 - 1, thinking=False, top_k=0), one_at_a_time=True,
                    weights="dequantized", window={"geometry": "AdnQywADAAA=", "sidebar": 0, "chat": 3},
                    drafts={3: "half"}, presets={"P": ChatSettings(temperature=0).to_dict()}, file=file,
                    draft_model="/m/a.gguf")
    assert s.save()
    again = AppSettings.load(file)
    assert again.unread == [] and again.notice == "" and not list(tmp_path.glob("*.damaged-*"))
    assert (again.theme, again.defaults, again.window, again.drafts) == (s.theme, s.defaults, s.window, s.drafts)


def test_a_read_only_instance_never_writes_or_moves_the_file(tmp_path):
    file = tmp_path / "settings.json"
    file.write_text(json.dumps({"presets": {"Mine": {"temperature": 0.3}}}))
    other = AppSettings.load(file, read_only=True)
    other.presets, other.drafts = {}, {}
    assert not other.save() and "Mine" in file.read_text()
    file.write_text("{damaged")
    AppSettings.load(file, read_only=True)
    assert file.read_text() == "{damaged" and not list(tmp_path.glob("*.damaged-*"))
    file.write_text(json.dumps({"theme": "Dark"}))
    assert AppSettings.load(file, read_only=True).unread and not list(tmp_path.glob("*.damaged-*"))


def test_a_chat_row_whose_settings_do_not_read_opens_with_what_does(tmp_path):
    store = SqliteConversationStore(tmp_path / "p.db")
    a, b = store.create("a"), store.create("b")
    store.close()
    import sqlite3

    db = sqlite3.connect(tmp_path / "p.db")
    db.execute("UPDATE conversation SET settings_json = ? WHERE id = ?", (json.dumps({"top_p": 0, "seed": 3}), a.id))
    db.execute("UPDATE conversation SET settings_json = ? WHERE id = ?", ("5", b.id))
    db.commit()
    db.close()
    again = SqliteConversationStore(tmp_path / "p.db")
    assert again.get(a.id).settings.top_p == ChatSettings().top_p and again.get(a.id).settings.seed == 3
    assert again.get(b.id).settings == ChatSettings()


def test_a_chats_stored_settings_that_do_not_read_are_named_and_kept_until_the_user_changes_them(tmp_path):
    """A chat's stored top_p 0 read as the default 0.95 without a word, and the next write of the chat's row (a new
    message, a rename, every quit) stored the defaults over it."""
    import sqlite3

    store = SqliteConversationStore(tmp_path / "p.db")
    a, b = store.create("Trip"), store.create("Fine")
    store.close()
    stored = json.dumps({"top_p": 0, "seed": 3})
    db = sqlite3.connect(tmp_path / "p.db")
    db.execute("UPDATE conversation SET settings_json = ? WHERE id = ?", (stored, a.id))
    db.commit()
    db.close()

    def row(conv_id: int) -> str:
        with sqlite3.connect(tmp_path / "p.db") as db:
            return db.execute("SELECT settings_json FROM conversation WHERE id = ?", (conv_id,)).fetchone()[0]

    store = SqliteConversationStore(tmp_path / "p.db")
    assert store.settings_notice == ("Settings of 1 chat did not read: the defaults are used until you change them, and "
                                     "what is stored is kept: “Trip”: top_p 0 (top_p must be in (0, 1]).")
    store.add_message(a.id, None, "user", "hello")
    store.update(a.id, title="Trip, renamed")
    store.close()
    assert row(a.id) == stored
    store = SqliteConversationStore(tmp_path / "p.db")
    store.update(a.id, settings=store.get(a.id).settings.copy(temperature=0.2))  # the user's own choice
    store.close()
    assert json.loads(row(a.id))["temperature"] == 0.2 and SqliteConversationStore(tmp_path / "p.db").settings_notice == ""


@pytest.mark.parametrize("text", ["{not json", json.dumps({"a": 1}), json.dumps([{"key": 1}])])
def test_a_damaged_old_models_json_does_not_keep_the_app_from_opening(tmp_path, text):
    legacy = tmp_path / "models.json"
    legacy.write_text(text)
    registry = SqliteModelRegistry(SqliteConversationStore(tmp_path / "p.db"), legacy_file=legacy)
    assert [e.key for e in registry.entries()] == ["default"]


def test_the_old_models_json_is_read_once_so_a_removed_model_stays_removed(tmp_path):
    legacy = tmp_path / "models.json"
    legacy.write_text(json.dumps([{"key": "/m/a.gguf", "name": "a", "path": "/m/a.gguf", "kind": "gguf"}]))
    store = SqliteConversationStore(tmp_path / "p.db")
    registry = SqliteModelRegistry(store, legacy_file=legacy)
    assert [e.key for e in registry.entries()] == ["default", "/m/a.gguf"]
    registry.remove("/m/a.gguf")
    store.close()
    again = SqliteModelRegistry(SqliteConversationStore(tmp_path / "p.db"), legacy_file=legacy)
    assert [e.key for e in again.entries()] == ["default"] and (tmp_path / "models.json.migrated").exists()
