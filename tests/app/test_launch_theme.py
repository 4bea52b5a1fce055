"""`parley --theme`: the colours of one launch, never the saved choice (the View menu's is)."""
from __future__ import annotations

import json

from engine.runtime import EngineConfig
from tests.app.conftest import TINY_ENGINE


def _build(tiny_models, data, theme):
    from app.qt.main import build

    return build(str(data), default_model=str(tiny_models["qwen3"].gguf_path), engine=EngineConfig(**TINY_ENGINE),
                 theme=theme, show=False)


def _saved_theme(data) -> str:
    return json.loads((data / "settings.json").read_text(encoding="utf-8"))["theme"]


def test_a_theme_flag_is_shown_for_its_launch_and_not_saved(qtbot, qapp, tiny_models, tmp_path):
    """`parley --theme dark` once: settings.json said 'dark' after it, so every later plain `parley` was dark."""
    data = tmp_path / "data"
    app = _build(tiny_models, data, "dark")
    try:
        assert app.window.dark
        app.window.close()  # the quit's save
        assert _saved_theme(data) == "system"
    finally:
        app.close()
    again = _build(tiny_models, data, None)
    try:
        assert not again.window.dark and again.settings.shown_theme == "system"
    finally:
        again.close()


def test_a_theme_chosen_in_the_menu_during_a_flagged_launch_is_saved(qtbot, qapp, tiny_models, tmp_path):
    data = tmp_path / "data"
    app = _build(tiny_models, data, "dark")
    try:
        app.window.set_theme("light")  # the View menu's choice wins over the flag, and is the user's to keep
        assert not app.window.dark
        app.window.close()
        assert _saved_theme(data) == "light"
    finally:
        app.close()
