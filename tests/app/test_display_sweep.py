"""Display and accessibility for demanding users: large fonts, small windows, themes switched at runtime."""
from __future__ import annotations

import gc

import pytest
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QAccessible, QColor, QFont, QFontMetrics, QGuiApplication, QPalette
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QAbstractButton, QApplication

from tests.app.helpers import configure, hold_engine, start_app, wait_idle


@pytest.fixture
def large_font_app(qtbot, qapp, tiny_models, tmp_path):
    """The app built under a 20 pt application font (a user's large-text setting)."""
    normal = QApplication.font()
    large = QFont(normal)
    large.setPointSize(20)
    QApplication.setFont(large)
    gc.collect()
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    yield app
    app.bridge.shutdown()
    QApplication.setFont(normal)


def _chat(parley, user: str, answer: str) -> int:
    store = parley.store
    conv = parley.service.new_conversation()
    first = store.add_message(conv, None, "user", user)
    store.add_message(conv, first.id, "assistant", answer)
    parley.window.open_chat(conv)
    return conv


def _gaps(view) -> list[int]:
    """Space between each message and the next as laid out: negative where one is drawn over the other."""
    model = view.model()
    rects = [view.visualRect(model.index(r, 0)) for r in range(model.rowCount())]
    return [b.top() - a.bottom() - 1 for a, b in zip(rects, rects[1:])]


def test_messages_never_overlap_after_a_resize_with_a_large_font(large_font_app, qtbot):
    w = large_font_app.window
    _chat(large_font_app, "Why is the sky blue? " * 3,
          "Because of **Rayleigh** scattering.\n\n```python\nprint('hi')\n```\n\nSee [link](https://example.com).")
    view = w.chat.view
    qtbot.wait(100)
    for height in range(600, 720, 12):  # through the height where the messages just overflow the view
        w.resize(1000, height)
        qtbot.wait(100)
        # the scroll bar coming and going at the edge must not leave a message placed by its size estimate
        assert _gaps(view) == [0], height


def _ink(icon) -> float:
    """The mean lightness (0–255) of an icon's opaque pixels: what colour it is drawn in."""
    image = icon.pixmap(QSize(24, 24)).toImage()
    shades = [image.pixelColor(x, y).lightness() for x in range(image.width()) for y in range(image.height())
              if image.pixelColor(x, y).alpha() > 200]
    assert shades, "the icon draws nothing"
    return sum(shades) / len(shades)


def test_icons_take_the_new_themes_colour_when_it_is_switched_at_runtime(parley):
    w = parley.window
    w.set_theme("light")
    icons = {"new chat": w.sidebar.new_button, "chat settings": w.chat.settings_button,
             "new comparison": w.compare.clear_button, "live stop": w.live_panel.stop_button}
    assert all(_ink(b.icon()) < 100 for b in icons.values())
    w.set_theme("dark")
    # drawn dark on a dark button they were all but invisible until a restart
    assert {name: _ink(b.icon()) > 150 for name, b in icons.items()} == dict.fromkeys(icons, True)
    assert _ink(w.sidebar._icons["pin"]) > 150
    w.set_theme("light")
    assert _ink(w.sidebar.new_button.icon()) < 100


def test_every_button_a_screen_reader_meets_has_a_name(parley, qtbot):
    w = parley.window
    w.show_compare()
    w.compare.set_columns(3)
    qtbot.wait(50)
    buttons = [b for b in w.findChildren(QAbstractButton) if b.isVisibleTo(w)]
    nameless = [(type(b.parent()).__name__, b.toolTip()) for b in buttons
                if not QAccessible.queryAccessibleInterface(b).text(QAccessible.Text.Name).strip()]
    assert buttons and nameless == []
    names = [QAccessible.queryAccessibleInterface(c.settings_button).text(QAccessible.Text.Name) for c in w.compare.columns]
    assert names == ["Settings of column A", "Settings of column B", "Settings of column C"]


def test_the_system_theme_is_followed_when_the_desktop_switches_while_parley_runs(parley, monkeypatch):
    from app.qt import theme

    w = parley.window
    desktop = {"dark": False}
    # the offscreen platform has no colour scheme to switch: the test answers for the desktop and sends its signal
    monkeypatch.setattr(theme, "is_dark", lambda mode: mode == "dark" or (mode == "system" and desktop["dark"]))
    w.set_theme("system")
    assert not w.dark
    desktop["dark"] = True
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert w.dark and w.chat.view.delegate.renderer.dark
    assert QGuiApplication.palette().color(QPalette.ColorRole.Base).lightness() < 80
    w.set_theme("light")  # a theme the user picked stays, whatever the desktop does
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert not w.dark


def test_a_long_model_name_loading_is_elided_in_the_status_bar_not_cut(parley, qtbot):
    from app.core.model_registry import ModelEntry
    from app.qt.model_manager import ModelState

    w, models = parley.window, parley.models
    name = "Very-Long-Model-Name-" + "x" * 160 + "-Instruct-Q4_K_M"
    entry = ModelEntry("/models/long.gguf", name, "/models/long.gguf", "gguf")
    models.states[entry.key] = ModelState(entry, stage="Reading model file")
    w.resize(640, 480)
    models.changed.emit(entry.key)
    qtbot.wait(50)
    label = w.load_label
    shown = label.text()
    assert w.width() == 640 and "…" in shown and shown.endswith(" s")  # the name gives way, the seconds stay
    assert label.fontMetrics().horizontalAdvance(shown) <= label.width()  # all of it on screen, nothing clipped
    assert name in label.toolTip()
    del models.states[entry.key]
    models.changed.emit(entry.key)


def test_a_large_font_keeps_the_context_meter_and_load_bar_readable(large_font_app, qtbot):
    from app.core.live import ChatStatus

    w = large_font_app.window
    meter = w.chat.status.meter
    w.chat.status.show_status(ChatStatus(model="m", context_used=12_345, context_limit=40_960))
    qtbot.wait(50)
    text = meter.text()
    assert text == "12,345 / 40,960"
    # the style sheet held both bars at 14 px whatever the font: a 20 pt figure was cut through the middle
    assert meter.height() >= meter.fontMetrics().height()
    assert meter.width() >= meter.fontMetrics().horizontalAdvance(text)
    assert w.load_progress.maximumHeight() >= w.load_progress.fontMetrics().height()


def test_a_large_font_keeps_three_lines_in_the_composer(large_font_app, qtbot):
    from app.qt.settings_dialog import SettingsForm

    edit = large_font_app.window.chat.composer.edit
    qtbot.wait(50)
    # a fixed 72 px showed a line and a half of 20 pt text behind a scroll bar
    assert edit.viewport().height() >= 3 * edit.fontMetrics().lineSpacing()
    form = SettingsForm(large_font_app.models.registry, large_font_app.service.defaults)
    qtbot.addWidget(form)
    assert form.system.height() >= 3 * form.system.fontMetrics().lineSpacing()


def test_a_large_font_keeps_the_chat_title_above_the_text(large_font_app):
    w = large_font_app.window
    # the style sheet's 15 px made the title smaller than every message under a 20 pt font
    assert w.chat.title.fontMetrics().height() > w.chat.composer.edit.fontMetrics().height()


def _changed_pixels(a, b) -> int:
    """Pixels of two same-sized images that differ clearly (a focus ring, not antialiasing noise)."""
    return sum(1 for x in range(a.width()) for y in range(a.height())
               if max(abs(c1 - c2) for c1, c2 in zip(a.pixelColor(x, y).getRgb(), b.pixelColor(x, y).getRgb())) > 60)


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_tabbing_onto_send_shows_where_the_focus_is(parley, qtbot, mode):
    w = parley.window
    w.set_theme(mode)
    w.activateWindow()
    composer = w.chat.composer
    composer.edit.setFocus()
    qtbot.wait(50)
    before = composer.send_button.grab().toImage()
    QTest.keyClick(composer.edit, Qt.Key.Key_Tab)  # Tab leaves the box for Send
    qtbot.wait(50)
    assert QApplication.focusWidget() is composer.send_button
    after = composer.send_button.grab().toImage()
    # a filled button's style sheet hid Fusion's focus frame: a keyboard user could not see Send was focused
    assert before.size() == after.size() and _changed_pixels(before, after) > 2 * (after.width() + after.height())
    w.set_theme("light")


def test_a_keyboard_user_can_take_a_queued_message_back_without_stopping_the_answer(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=400)
    w.activateWindow()
    hold_engine(parley, 1.0)
    assert w.chat.send("first")
    w.chat.composer.edit.setPlainText("not yet")
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    note = w.chat.queued
    assert note.isVisibleTo(w)
    # the note's "Back to the box" link answered the mouse only: Tab passed it by and Enter did nothing
    assert QApplication.focusWidget() is w.chat.composer.edit
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Backtab, Qt.KeyboardModifier.ShiftModifier)  # just above the box
    assert QApplication.focusWidget() is note
    qtbot.keyClick(note, Qt.Key.Key_Return)
    assert w.chat.composer.edit.toPlainText() == "not yet" and parley.service.busy(conv)
    w.stop()
    wait_idle(parley, qtbot, conv)


def test_the_live_panel_names_a_loading_chats_model_not_its_file_path(parley, qtbot):
    from app.core.model_registry import ModelEntry
    from app.qt.model_manager import ModelState

    w, models = parley.window, parley.models
    entry = ModelEntry("/models/Big-Model-Q4_K_M.gguf", "Big Model", "/models/Big-Model-Q4_K_M.gguf", "gguf")
    models.registry.add(entry)
    models.states[entry.key] = ModelState(entry, stage="Reading model file")  # a load that takes its time
    conv = w.new_chat()
    configure(parley, conv, model=entry.key)
    assert w.chat.send("hello")
    rows = {row[0]: row for row in w.live_panel.rows()}
    # the chat's settings hold the model's key, its path: the panel showed that path until the model loaded
    assert rows[conv][2] == "Big Model"
    w.stop()
    del models.states[entry.key]


def test_a_long_model_name_leaves_the_live_panels_state_and_speed_in_view(parley, qtbot):
    from app.core.model_registry import ModelEntry
    from app.qt.model_manager import ModelState

    w, models = parley.window, parley.models
    name = "Very-Long-Model-Name-" + "x" * 160 + "-Instruct-Q4_K_M"
    entry = ModelEntry("/models/long.gguf", name, "/models/long.gguf", "gguf")
    models.registry.add(entry)
    models.states[entry.key] = ModelState(entry, stage="Reading model file")
    conv = w.new_chat()
    configure(parley, conv, model=entry.key)
    w.resize(1000, 500)
    assert w.chat.send("hello")
    w.live_panel.show()
    qtbot.wait(100)
    table = w.live_panel.table
    # the Model column grew to the name's 1,400 px and pushed State and tok/s out of sight
    assert table.horizontalScrollBar().maximum() == 0
    assert sum(table.columnWidth(c) for c in range(4)) <= table.viewport().width()
    assert table.topLevelItem(0).toolTip(1) == name
    w.stop()
    del models.states[entry.key]


def test_long_column_labels_keep_the_diff_dialog_on_screen(parley, qtbot):
    from app.core.model_registry import ModelEntry

    w = parley.window
    name = "Very-Long-Model-Name-" + "x" * 160 + "-Instruct-Q4_K_M"
    entry = ModelEntry("/models/long.gguf", name, "/models/long.gguf", "gguf")
    parley.models.registry.add(entry)
    w.show_compare()
    for column in w.compare.columns:
        parley.service.set_settings(column.conv_id, parley.store.get(column.conv_id).settings.copy(model=entry.key))
    dialog = w.compare.show_diff()
    qtbot.wait(50)
    # each picker was as wide as its 200-character label: a 2,900 px dialog with Close off the screen
    assert dialog.minimumSizeHint().width() <= 800 and dialog.width() <= 800
    assert name in dialog.left.itemData(0, Qt.ItemDataRole.ToolTipRole)
    dialog.close()


def test_a_font_change_while_a_chat_is_open_reaches_its_messages(parley, qtbot):
    w = parley.window
    conv = _chat(parley, "hello", "hi there")
    view = w.chat.view
    qtbot.wait(50)
    message = parley.store.path(conv)[-1]
    before = view.delegate.document(message)[0].defaultFont().pointSizeF()
    larger = QFont(view.font())
    larger.setPointSizeF(before * 2)
    view.setFont(larger)  # what a desktop's text-size setting does to a running app
    qtbot.wait(50)
    # the cached documents kept the old size until each message changed
    assert view.delegate.document(message)[0].defaultFont().pointSizeF() == before * 2
    assert _gaps(view) == [0]


def test_a_large_font_grows_the_icons_with_it(large_font_app, qtbot):
    """Fusion's icons stayed 16 px beside a 20-pt font's 31-px lines: a send arrow a third of its label's height."""
    w = large_font_app.window
    line = w.fontMetrics().height()
    for button in (w.chat.composer.send_button, w.chat.settings_button, w.sidebar.new_button):
        assert button.iconSize().height() >= 0.8 * line, button.objectName() or button.toolTip()


def test_a_large_font_in_a_short_window_scrolls_the_empty_chat_and_shortens_its_samples(large_font_app, qtbot):
    """The empty chat's note was squeezed until its lines overlapped "Try one of these:", and a long sample prompt
    was cut at both edges of its button, mid-word."""
    w = large_font_app.window
    w.resize(1200, 800)
    w.show()
    qtbot.waitUntil(lambda: w.chat.body.currentWidget() is w.chat.empty)
    qtbot.wait(100)
    note = w.chat.empty.note
    assert note.height() >= note.heightForWidth(note.width())  # every line of it laid out, none drawn over
    for button in w.chat.empty.buttons:
        shown = button.text()
        assert button.fontMetrics().horizontalAdvance(shown) <= button.width()
        assert shown == button.full_text() or shown.endswith("…")


def test_a_large_font_keeps_the_models_dialogs_headers_whole(large_font_app, qtbot):
    """The headers read "Archite", "Quantiz", "Contex" while "In memory" took the slack."""
    dialog = large_font_app.window.show_models()
    qtbot.waitExposed(dialog)
    header = dialog.table.header()
    for col in range(1, header.count()):
        assert header.sectionSize(col) >= header.sectionSizeHint(col), dialog.table.headerItem().text(col)
    assert header.sectionSize(0) >= header.sectionSize(header.count() - 1)  # the name takes what is left
    dialog.close()


def test_a_tables_cells_take_the_new_themes_answer_colour_when_it_is_switched_at_runtime(parley):
    """A table's cells are painted the colour of the answer's bubble (its grid shows between them): switched to dark at
    runtime, a light cell would sit in a dark answer."""
    w = parley.window
    for theme in ("light", "dark", "light"):
        w.set_theme(theme)
        bubble = w.chat.view.palette().color(QPalette.ColorRole.Base).name()
        html, _ = w.chat.view.delegate.renderer.render("| a | b |\n|---|---|\n| 1 | 2 |")
        assert f'bgcolor="{bubble}"' in html and (QColor(bubble).lightness() < 128) == (theme == "dark"), theme


def _cell_text(table, row: int, column: int) -> str:
    """A cell's text as the view draws it: elided to its column as the view and the column's delegate say."""
    from PySide6.QtWidgets import QStyleOptionViewItem

    index, option = table.model().index(row, column), QStyleOptionViewItem()
    table.initViewItemOption(option)
    table.itemDelegateForIndex(index).initStyleOption(option, index)
    room = table.columnWidth(column) - 8  # the cell's margins
    return table.fontMetrics().elidedText(option.text, option.textElideMode, room)


def test_the_live_panel_is_readable_at_800_px_with_two_quantizations_of_one_model_loading(parley, qtbot):
    """At 800 px State took 164 px for 'waiting for the model · 0 s' (a prompt read: 'reading the prompt (812 tokens) ·
    4 s'), Chat and Model 40 px each ('b…M', 'b…0': a repository's quantizations alike) and tok/s went out of sight.
    State says it in a word (whole in its tooltip); Model is cut in the middle, as the pickers cut names."""
    from app.core.model_registry import ModelEntry
    from app.qt.live_panel import MODEL_COLUMN
    from app.qt.model_manager import ModelState

    w, models = parley.window, parley.models
    repo = "bartowski/Qwen2.5-7B-Instruct-GGUF · Qwen2.5-7B-Instruct-"
    entries = [ModelEntry(f"/models/{q}.gguf", repo + q, f"/models/{q}.gguf", "gguf") for q in ("Q4_K_M", "Q8_0")]
    for entry in entries:
        models.registry.add(entry)
        models.states[entry.key] = ModelState(entry, stage="Reading model file")  # a load that takes its time
        configure(parley, w.new_chat(), model=entry.key)
        assert w.chat.send("Why is the sky blue? A long question about light")
    w.resize(800, 600)
    w.live_panel.show()
    table = w.live_panel.table
    qtbot.waitUntil(lambda: table.topLevelItemCount() == 2)
    qtbot.waitUntil(lambda: sum(table.columnWidth(c) for c in range(4)) <= table.viewport().width(),  # tok/s seen
                    timeout=2_000)
    assert table.topLevelItem(0).text(2) == "loading · 0 s"
    assert table.topLevelItem(0).toolTip(2) == "waiting for the model · 0 s"
    shown = [[_cell_text(table, row, column) for column in (0, MODEL_COLUMN)] for row in range(2)]
    assert all(chat.startswith("Why is t") for chat, _model in shown), shown  # at its heading's width: 'Why…'
    assert shown[0][1].endswith("K_M") and shown[1][1].endswith("8_0"), shown
    for conv in parley.service.live_chats():
        parley.service.stop(conv)
    for entry in entries:
        del models.states[entry.key]


def test_a_normal_font_asks_python_for_no_pixel_metric(parley, qtbot, monkeypatch):
    """Every metric a Python style answers waits for the GIL a streaming engine holds, and a layout asks hundreds: a
    settings dialog and a chat switch beside three streaming chats took 107 ms, 47 ms with Fusion's own metrics."""
    from app.qt.theme import FontScaledStyle

    asked = []
    real = FontScaledStyle.pixelMetric
    monkeypatch.setattr(FontScaledStyle, "pixelMetric", lambda self, *a: asked.append(a[0]) or real(self, *a))
    w = parley.window
    w.set_theme("dark")  # the style is set again
    w.set_theme("light")
    from app.qt.settings_dialog import SettingsDialog

    dialog = SettingsDialog(parley.models.registry, parley.store.get(w.current()).settings, parent=w)
    dialog.show()
    qtbot.waitExposed(dialog)
    dialog.close()
    assert asked == []


def test_icons_grow_with_a_font_made_larger_while_the_app_runs(parley, qtbot):
    """A desktop's text size raised with Parley open: icons grow with it (Fusion's own metrics stay 16 px)."""
    w = parley.window
    normal = QApplication.font()
    large = QFont(normal)
    large.setPointSize(20)
    QApplication.setFont(large)
    try:
        line = QFontMetrics(large).height()
        qtbot.waitUntil(lambda: w.chat.composer.send_button.iconSize().height() >= 0.8 * line)
    finally:
        QApplication.setFont(normal)
    assert w.chat.composer.send_button.iconSize().height() == 16


def test_the_live_panel_beside_a_comparison_keeps_an_800_px_window_800_px_wide(parley, qtbot):
    """The comparison's bar (its New comparison button's text) and the Live panel beside it made an 800 px window
    862 px wide, its right edge off a small screen: the button keeps its icon alone while the bar is short of room."""
    w = parley.window
    w.resize(800, 600)
    w.show_compare()
    w.live_panel.show()
    qtbot.waitUntil(lambda: w.live_panel.isVisible())
    w.resize(800, 600)
    qtbot.wait(50)
    button = w.compare.clear_button
    assert w.width() == 800 and button.toolButtonStyle() == Qt.ToolButtonStyle.ToolButtonIconOnly
    assert QAccessible.queryAccessibleInterface(button).text(QAccessible.Text.Name) == "New comparison"
    w.live_panel.hide()
    w.resize(1200, 700)
    qtbot.waitUntil(lambda: button.toolButtonStyle() == Qt.ToolButtonStyle.ToolButtonTextBesideIcon)


def test_the_models_dialog_opens_no_wider_than_the_screen(parley, qtbot):
    """It opened at least 860 px wide: on an 800 px screen its right edge (Remove, Close) was off it."""
    dialog = parley.window.show_models()
    qtbot.waitExposed(dialog)
    assert dialog.width() <= dialog.screen().availableGeometry().width() == 800
    dialog.close()
