"""What a new user's first hour found (sweep AL), each as the user meets it: keys, focus and what stays on screen."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from tests.app.helpers import start_app, wait_idle


def _active(qtbot, window) -> None:
    """Shortcuts reach only an active window (offscreen too)."""
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)


def test_a_restart_puts_the_cursor_in_the_message_box(qtbot, qapp, tiny_models, tmp_path):
    """The chat open at close comes back with the box focused: the New chat button had the focus, so what the user
    typed went nowhere and a Space made another chat."""
    first = start_app(qtbot, tmp_path / "data", tiny_models)
    first.store.add_message(first.window.current(), None, "user", "kept")
    first.close()
    second = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        assert second.window.focusWidget() is second.window.chat.composer.edit
    finally:
        second.close()


def test_ctrl_shift_z_in_the_message_box_brings_a_deleted_chat_back(parley, qtbot):
    """Ctrl+Shift+Z is the box's Redo on Linux: it swallowed Undo delete wherever the box had the focus, which is
    almost always. It redoes in the box only when there is something to redo."""
    w = parley.window
    kept, gone = w.current(), w.new_chat()
    _active(qtbot, w)
    w.delete_current()
    assert gone not in w.sidebar.ids() and w.current() == kept
    edit = w.chat.composer.edit
    edit.setFocus()
    QTest.keyClick(edit, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert gone in w.sidebar.ids() and w.current() == gone
    edit = w.chat.composer.edit
    QTest.keyClicks(edit, "draft")
    QTest.keyClick(edit, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert edit.toPlainText() == ""
    QTest.keyClick(edit, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert edit.toPlainText() == "draft"  # the box's own Redo, as before


def test_editing_a_message_keeps_the_sidebar_width(parley, qtbot):
    """The edit banner was one unwrapped line: in an 800 px window it pushed the sidebar from 260 to 211 px."""
    w = parley.window
    w.resize(800, 600)
    conv = w.current()
    user = parley.store.add_message(conv, None, "user", "hello")
    w.open_chat(conv)
    qtbot.wait(20)
    before = w.splitter.sizes()
    w.chat.begin_edit(user.id)
    qtbot.wait(20)
    assert w.chat.composer.banner.isVisible()
    assert w.splitter.sizes() == before and w.width() == 800


def test_a_compare_prompt_shows_every_column_answering(parley, qtbot):
    """Scrolled up to read (synced columns scroll together), a new prompt's answers streamed out of sight: a chat's
    send brought its view back to the bottom, the compare view's did not."""
    w = parley.window
    view = w.compare
    w.show_compare()
    for column in view.columns:
        conv = column.conv_id
        parent = None
        for i in range(12):
            text = "\n\n".join(f"line {n}" for n in range(8))
            parent = parley.store.add_message(conv, parent, "assistant" if i % 2 else "user", text).id
        parley.service.set_settings(conv, parley.store.get(conv).settings.copy(temperature=0.0, max_tokens=4))
        column.attach(conv)
    qtbot.wait(50)
    bars = [c.view.verticalScrollBar() for c in view.columns]
    assert all(bar.maximum() > 0 for bar in bars)
    for bar in bars:
        bar.setValue(0)  # the user scrolled up
    assert view.send("one more")
    wait_idle(parley, qtbot, *[c.conv_id for c in view.columns])
    qtbot.wait(50)
    assert all(bar.value() == bar.maximum() for bar in bars), [(bar.value(), bar.maximum()) for bar in bars]


def test_the_seconds_of_a_load_stay_on_screen(parley, qtbot):
    """The load's seconds came last and were cut off first: the embedded model's first start read "Loading Gemma 3
    270M (embedded, base model): Building Parley's CPU kernels (once for this computer) · …" at 1200 px wide."""
    from app.core.model_registry import ModelEntry
    from app.qt.model_manager import ModelState

    w, models = parley.window, parley.models
    w.resize(700, 600)
    entry = ModelEntry("/models/g.gguf", "Gemma 3 270M (embedded, base model)", "/models/g.gguf", "gguf")
    models.states[entry.key] = state = ModelState(entry, stage="Building Parley's CPU kernels (once for this computer)")
    state.started -= 12
    try:
        models.changed.emit(entry.key)
        qtbot.wait(50)
        label = w.load_label
        assert label.fontMetrics().horizontalAdvance(label.full_text()) > label.width()  # too long for the bar
        shown = label.text()
        assert shown.endswith("· 12 s") and "…" in shown
        assert label.fontMetrics().horizontalAdvance(shown) <= label.width()
    finally:
        del models.states[entry.key]
        models.changed.emit(entry.key)
