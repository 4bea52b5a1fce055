"""settings.json edited by another program (an editor, a sync tool) while Parley runs: Parley's next save keeps the
edit, unless Parley changed the same value itself since."""
from __future__ import annotations

import json

from app.core.app_settings import AppSettings
from app.core.settings_merge import merged


def _edit(file, change) -> None:
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data))


def test_an_edit_made_while_parley_runs_survives_its_saves(tmp_path):
    """Before: the next save (a draft typed, the window's geometry at quit) wrote the whole file from memory: the
    app run offscreen on the embedded model put theme 'dark' and temperature 0.3 back to 'system' and 0.7."""
    file = tmp_path / "settings.json"
    AppSettings(file=file, presets={"short": {"max_tokens": 64}}).save()
    s = AppSettings.load(file)

    def edit(data):
        data["theme"], data["defaults"]["temperature"] = "dark", 0.3
        data["presets"]["long"] = {"max_tokens": 4096}
    _edit(file, edit)
    s.drafts = {1: "a draft typed after the edit"}
    s.presets["mine"] = {"top_k": 5}
    assert s.save()
    s.window = {"sidebar": 200}  # the quit's save: a second one must keep the edit too
    assert s.save()
    data = json.loads(file.read_text())
    assert data["theme"] == "dark" and data["defaults"]["temperature"] == 0.3
    assert data["drafts"] == {"1": "a draft typed after the edit"} and data["window"] == {"sidebar": 200}
    assert set(data["presets"]) == {"short", "long", "mine"}
    again = AppSettings.load(file)
    assert again.theme == "dark" and again.defaults.temperature == 0.3 and not again.unread


def test_a_value_changed_on_both_sides_is_parleys_and_a_file_left_alone_is_written_as_before(tmp_path):
    file = tmp_path / "settings.json"
    AppSettings(file=file).save()
    s = AppSettings.load(file)
    _edit(file, lambda data: data.update(theme="dark"))
    s.theme = "light"  # the user's latest act, in the app
    assert s.save() and json.loads(file.read_text())["theme"] == "light"
    s.theme = "dark"
    assert s.save() and json.loads(file.read_text()) == s.as_json()


def test_merge_keeps_each_sides_own_changes_key_by_key():
    base = {"a": 1, "d": {"x": 1, "y": 1}, "gone": 1}
    ours = {"a": 2, "d": {"x": 2, "y": 1}, "gone": 1}
    theirs = {"a": 1, "d": {"x": 1, "y": 3}, "new": 5}
    assert merged(base, ours, theirs) == {"a": 2, "d": {"x": 2, "y": 3}, "new": 5}
