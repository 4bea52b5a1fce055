"""The chat settings form saves what it was given where the user changed nothing, whatever its fields can show."""
from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from app.core.chat_settings import ChatSettings
from app.core.sqlite_registry import SqliteModelRegistry
from app.core.sqlite_store import SqliteConversationStore


@pytest.fixture
def form(qtbot, tmp_path):
    from app.qt.settings_dialog import SettingsForm

    def make(settings: ChatSettings) -> SettingsForm:
        registry = SqliteModelRegistry(SqliteConversationStore(tmp_path / "p.db"), legacy_file=tmp_path / "m.json")
        w = SettingsForm(registry, settings)
        qtbot.addWidget(w)
        return w

    return make


@pytest.mark.parametrize("changes", [
    {"seed": 2**31}, {"seed": 2**63 + 5}, {"temperature": 0.005}, {"temperature": 0.0004}, {"temperature": 20.0},
    {"top_k": 200_000}, {"repetition_penalty": 7.0}, {"top_p": 0.0005}, {"max_tokens": 100_000},
    {"min_p": 0.9995},
])
def test_a_value_the_form_cannot_show_is_saved_as_it_was(form, changes):
    settings = ChatSettings(**changes)
    assert form(settings).settings() == settings


def test_a_changed_field_takes_the_new_value_and_the_others_stay(form):
    w = form(ChatSettings(seed=2**40, temperature=0.005))
    w.temperature.setValue(0.25)
    assert w.settings() == ChatSettings(seed=2**40, temperature=0.25)
    w.seed.setValue(-1)
    assert w.settings().seed is None


def test_small_values_can_be_typed(form):
    w = form(ChatSettings())
    w.temperature.setValue(0.005)
    w.top_p.setValue(0.005)
    assert (w.settings().temperature, w.settings().top_p) == (0.005, 0.005)


@pytest.mark.parametrize("points", [0, 20], ids=["usual-font", "20pt"])
def test_the_settings_dialog_fits_the_screen_at_any_font_size(qtbot, qapp, tmp_path, points):
    """At 20 pt the dialog's form made it 1297 x 793 with no way to shrink it, OK and Cancel off a laptop's screen; the
    form now scrolls where the screen cannot hold it, and at the usual size it shows whole, without a scroll bar."""
    from app.qt.settings_dialog import SettingsDialog

    before = qapp.font()
    if points:
        font = qapp.font()
        font.setPointSize(points)
        qapp.setFont(font)
    try:
        registry = SqliteModelRegistry(SqliteConversationStore(tmp_path / "p.db"), legacy_file=tmp_path / "m.json")
        dialog = SettingsDialog(registry, ChatSettings())
        qtbot.addWidget(dialog)
        room = dialog.screen().availableGeometry()
        hint = dialog.minimumSizeHint()
        assert hint.height() <= room.height() and hint.width() <= room.width(), (hint, room)
        if not points:
            from PySide6.QtWidgets import QScrollArea

            dialog.show()
            qtbot.waitExposed(dialog)
            scroll = dialog.findChild(QScrollArea)
            assert scroll is not None and not scroll.verticalScrollBar().isVisible()  # shown whole
    finally:
        qapp.setFont(before)


def test_fields_that_temperature_0_or_penalty_1_make_do_nothing_are_greyed_with_why(form):
    """The form took a seed beside temperature 0 and the greedy answer ignored it, not a word said."""
    w = form(ChatSettings(temperature=0.0, seed=7, repetition_penalty=1.0))
    drawn = [w.top_p, w.top_k, w.min_p, w.seed]
    assert not any(f.isEnabled() for f in drawn + [w.repeat_last_n])
    assert w.greedy_note.isVisibleTo(w) and w.penalty_note.isVisibleTo(w)
    assert "the seed" in w.greedy_note.text()
    assert w.settings() == ChatSettings(temperature=0.0, seed=7, repetition_penalty=1.0)  # kept, only greyed
    w.temperature.setValue(0.5)
    w.repetition.setValue(1.1)
    assert all(f.isEnabled() for f in drawn + [w.repeat_last_n])
    assert not w.greedy_note.isVisibleTo(w) and not w.penalty_note.isVisibleTo(w)
    w.set_settings(ChatSettings(temperature=0.0004))  # shown as 0.000, drawn by the engine: not greedy
    assert w.seed.isEnabled()


@pytest.mark.parametrize("dark", [False, True])
def test_a_greyed_field_looks_greyed_in_the_apps_themes(qapp, dark):
    """The themes' palette gave disabled text the colour of enabled text: the greyed seed looked as open as any."""
    from PySide6.QtGui import QPalette

    from app.qt.theme import palette

    p, group = palette(dark), QPalette.ColorGroup
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        active, disabled = p.color(group.Active, role), p.color(group.Disabled, role)
        assert abs(active.lightness() - disabled.lightness()) > 60, role
