"""What a new user's first day found (issue 22, items 1-14; issue 23, item 1), each as the user meets it."""
from __future__ import annotations

import re
import shutil

from PySide6.QtCore import QPoint, Qt, QUrl
from PySide6.QtGui import QColor, QImage, QPainter, QTextDocument

from tests.app.helpers import configure, hold_engine, last, start_app, wait_idle


def _ttfts(text: str) -> list[str]:
    return re.findall(r"TTFT (\d+) ms", text)


# -- 1: the sidebar after a restart
def test_sidebar_lists_the_chats_after_a_restart(qtbot, qapp, tiny_models, tmp_path):
    first = start_app(qtbot, tmp_path / "data", tiny_models)
    a = first.window.current()
    first.service.rename(a, "Alpha")
    b = first.window.new_chat()
    first.service.rename(b, "Beta")
    first.store.add_message(b, None, "user", "kept")
    first.close()
    second = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        w = second.window
        assert set(w.sidebar.ids()) == {a, b}
        assert w.sidebar.current_id() == w.current() is not None
        before = w.current()
        w.shortcuts["Ctrl+Tab"].trigger()
        assert w.current() != before and w.current() in (a, b)
    finally:
        second.close()


# -- 2, 3: compare columns fit the window and name their loaded model
def _inside(widget, window) -> bool:
    corner = widget.mapTo(window, QPoint(widget.width(), widget.height()))
    return 0 < corner.x() <= window.width() and 0 < corner.y() <= window.height()


def test_compare_columns_never_widen_the_window(parley, qtbot):
    w = parley.window
    w.resize(1200, 780)
    w.show_compare()
    for n in (2, 3, 4):
        w.compare.set_columns(n)
        qtbot.wait(20)
        assert w.width() == 1200, f"{n} columns widened the window to {w.width()} px"
        assert w.sidebar.width() >= 180
        assert _inside(w.compare.composer.send_button, w) and _inside(w.compare.count, w)
    w.compare.columns[3].promote_button.click()
    w.show_compare()
    qtbot.wait(20)
    assert w.width() == 1200
    w.resize(1024, 700)
    qtbot.wait(20)
    assert w.width() == 1024 and w.minimumSizeHint().width() <= 1024
    view = w.compare
    view.scroll_to(view.columns[3])
    qtbot.wait(20)
    assert _inside(view.columns[3].promote_button, w)  # reachable: tiled or scrolled to


def test_a_long_title_or_the_live_panel_never_widens_the_window(parley, qtbot):
    """A chat's title of any length elides (full text in its tooltip); showing the live panel keeps the width."""
    w = parley.window
    w.resize(800, 600)
    conv = w.current()
    long_title = "A very long chat title that goes on and on about lighthouses, keepers and the sea " * 3
    parley.service.rename(conv, long_title)
    w.open_chat(conv)
    qtbot.wait(20)
    assert w.width() == 800 and w.minimumSizeHint().width() <= 800
    assert w.chat.title.full_text() == w.chat.title.toolTip() and w.chat.title.full_text().startswith("A very long")
    assert w.chat.title.text().endswith("…")
    w.live_panel.show()
    qtbot.wait(20)
    assert w.width() == 800, f"the live panel widened the window to {w.width()} px"


def test_a_long_model_name_never_widens_the_window(qtbot, qapp, tiny_models, tmp_path):
    """The picker sizes itself on first show: after a restart a GGUF file stem elides (full name in the tooltip)."""
    from app.core.model_registry import ModelEntry

    name = "Meta-Llama-3.1-70B-Instruct-abliterated-uncensored-Q4_K_M-imatrix-calibrated-v2.1-final"
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    app.models.registry.add(ModelEntry("/m/long.gguf", name, "/m/long.gguf", "gguf"))
    app.close()
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        w = app.window
        w.resize(800, 600)
        qtbot.wait(20)
        assert w.width() == 800 and w.chat.title.width() > 100, (w.width(), w.chat.title.width())
        picker = w.chat.picker
        assert name in picker.itemData(picker.findData("/m/long.gguf"), Qt.ItemDataRole.ToolTipRole)
        picker.setCurrentIndex(picker.findData("/m/long.gguf"))
        shown = picker.shown_text()  # elided in the middle: the start and the quantisation stay readable
        assert shown.startswith("Meta-Llama") and shown.endswith("final") and "…" in shown and len(shown) < len(name)
    finally:
        app.close()


def test_a_new_column_names_its_loaded_model(parley, qtbot):
    w = parley.window
    w.show_compare()
    w.compare.set_columns(3)
    for column in w.compare.columns:
        text = column.stats.text()
        assert "qwen3" in text and "loading" not in text and "no model yet" not in text, text


# -- 4: compare columns and their settings survive a restart; no hidden rows pile up
def test_compare_is_kept_across_restarts(qtbot, qapp, tiny_models, tmp_path):
    import sqlite3

    app = start_app(qtbot, tmp_path / "data", tiny_models)
    view = app.window.compare
    app.window.show_compare()
    view.set_columns(3)
    convs = [c.conv_id for c in view.columns]
    for conv in convs:
        app.service.set_settings(conv, app.store.get(conv).settings.copy(temperature=0.0, max_tokens=4))
    app.service.set_settings(convs[1], app.store.get(convs[1]).settings.copy(temperature=0.2))
    assert view.send("kept?")
    wait_idle(app, qtbot, *convs)
    app.close()
    for _ in range(3):
        app = start_app(qtbot, tmp_path / "data", tiny_models)
        view = app.window.compare
        assert [c.conv_id for c in view.columns] == convs and view.count.value() == 3
        assert app.store.get(convs[1]).settings.temperature == 0.2
        assert [m.content for m in app.store.path(convs[0])][0] == "kept?"
        assert view.columns[0].view.model().rowCount() == 2
        app.close()
    db = sqlite3.connect(tmp_path / "data" / "parley.db")
    hidden = db.execute("SELECT COUNT(*) FROM conversation WHERE hidden = 1").fetchone()[0]
    db.close()
    assert hidden == 3


def test_columns_left_by_older_versions_are_cleaned_up_or_listed(qtbot, qapp, tiny_models, tmp_path):
    from app.core.sqlite_store import SqliteConversationStore

    store = SqliteConversationStore(tmp_path / "data" / "parley.db")  # what older versions left: columns, no group
    empty = [store.create(hidden=True).id for _ in range(4)]
    written = store.create("Old column", hidden=True).id
    store.add_message(written, None, "user", "an old compare prompt")
    store.close()
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        assert not any(app.store.has(c) for c in empty)
        assert written in app.window.sidebar.ids() and not app.store.get(written).hidden
    finally:
        app.close()


# -- 5: Ctrl+, in compare view edits a column, not the chat behind it
def test_settings_shortcut_in_compare_edits_the_focused_column(parley, qtbot, monkeypatch):
    from app.qt.settings_dialog import SettingsDialog

    w = parley.window
    chat = w.current()
    w.show_compare()
    column = w.compare.columns[1]
    w.activateWindow()
    column.view.setFocus()
    qtbot.waitUntil(column.view.hasFocus)
    shown = []

    def accept(dialog) -> int:
        shown.append(dialog.windowTitle())
        dialog.form.temperature.setValue(0.33)
        return 1

    monkeypatch.setattr(SettingsDialog, "exec", accept)
    w.shortcuts["Ctrl+,"].trigger()
    assert parley.store.get(column.conv_id).settings.temperature == 0.33
    assert parley.store.get(chat).settings.temperature != 0.33
    assert shown and "B" in shown[0]


# -- 6: drafts belong to their chat
def test_each_chat_keeps_its_own_draft(parley, qtbot):
    w = parley.window
    a = w.current()
    b = w.new_chat()
    w.open_chat(a)
    qtbot.keyClicks(w.chat.composer.edit, "half a thought for A")
    w.shortcuts["Ctrl+Tab"].trigger()
    assert w.current() == b and w.chat.composer.edit.toPlainText() == ""
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    assert parley.store.path(b) == []
    w.open_chat(a)
    assert w.chat.composer.edit.toPlainText() == "half a thought for A"


def test_drafts_survive_a_restart(qtbot, qapp, tiny_models, tmp_path):
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    a = app.window.current()
    b = app.window.new_chat()
    app.window.chat.composer.edit.setPlainText("for B, later")
    app.window.open_chat(a)
    app.window.chat.composer.edit.setPlainText("for A, later")
    app.close()
    again = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        w = again.window
        w.open_chat(a)
        assert w.chat.composer.edit.toPlainText() == "for A, later"
        w.open_chat(b)
        assert w.chat.composer.edit.toPlainText() == "for B, later"
    finally:
        again.close()


def test_a_draft_is_saved_while_typing_not_only_at_close(parley, qtbot):
    """A crash (no closeEvent) keeps what was typed: settings.json has it soon after the last key."""
    from app.core.app_settings import AppSettings

    conv = parley.window.current()
    qtbot.keyClicks(parley.window.chat.composer.edit, "half a thought")
    qtbot.waitUntil(lambda: AppSettings.load(parley.settings.file).drafts == {conv: "half a thought"}, timeout=5_000)


# -- 7: Enter while a chat answers queues the next turn, visibly
def test_enter_while_busy_queues_the_next_turn(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=400)
    hold_engine(parley, 1.0)  # "first" is surely still answering when Enter is pressed
    assert w.chat.send("first")
    assert parley.service.busy(conv)
    qtbot.keyClicks(w.chat.composer.edit, "second")
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    assert w.chat.composer.edit.toPlainText() == ""
    assert w.chat.queued.isVisibleTo(w) and "second" in w.chat.queued.text()
    configure(parley, conv, max_tokens=4)
    qtbot.waitUntil(lambda: len(parley.store.path(conv)) == 4, timeout=60_000)
    wait_idle(parley, qtbot, conv)
    path = parley.store.path(conv)
    assert [m.content for m in path][::2] == ["first", "second"] and path[-1].state == "done"
    assert not w.chat.queued.isVisibleTo(w)


def test_stop_returns_a_queued_message_to_the_composer(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=400)
    hold_engine(parley, 1.0)
    assert w.chat.send("first")
    w.chat.composer.edit.setPlainText("not yet")
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    w.stop()
    wait_idle(parley, qtbot, conv)
    assert [m.content for m in parley.store.path(conv)][::2] == ["first"]
    assert w.chat.composer.edit.toPlainText() == "not yet" and not w.chat.queued.isVisibleTo(w)


# -- 8: the pin marker is an icon, not an emoji
def test_pinned_chats_show_the_pin_icon(parley):
    w, service = parley.window, parley.service
    conv = w.current()
    service.rename(conv, "Groceries")
    service.set_pinned(conv, True)
    row = w.sidebar.model.index(0, 0)
    assert row.data() == "Groceries" and not row.data(Qt.ItemDataRole.DecorationRole).isNull()
    service.set_pinned(conv, False)
    assert w.sidebar.model.index(0, 0).data(Qt.ItemDataRole.DecorationRole) is None


# -- 9: a fixed seed: Regenerate draws another answer, with the next seed, and the chat repeats as a whole
def _seeded_answers(parley, qtbot, regenerations: int) -> list:
    w = parley.window
    conv = w.new_chat()
    configure(parley, conv, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7, max_tokens=10)
    w.chat.send("roll the dice")
    wait_idle(parley, qtbot, conv)
    for _ in range(regenerations):
        w.chat.view.activate(last(parley, conv), "regen:")
        wait_idle(parley, qtbot, conv)
    return parley.store.versions(last(parley, conv))


def test_regenerate_with_a_fixed_seed_draws_the_next_seed(parley, qtbot):
    """Regenerate under a fixed seed gave the same answer again, which is not what the button is pressed for: the k-th
    version draws with seed + k - 1 and says so; another chat with that seed gives the same versions."""
    answers = _seeded_answers(parley, qtbot, regenerations=1)
    assert [a.stats["seed"] for a in answers] == [7, 8]
    assert answers[0].content != answers[1].content
    shown = parley.window.chat.view.delegate.document(answers[1])[0].toPlainText()
    assert "seed 8" in shown
    assert [a.content for a in _seeded_answers(parley, qtbot, regenerations=1)] == [a.content for a in answers]


# -- 10: tables, math and block quotes
def _render(parley, text: str):
    conv = parley.window.current()
    msg = parley.store.add_message(conv, None, "assistant", text)
    parley.window.open_chat(conv)
    return parley.window.chat.view.delegate.document(msg)[0]


def _tables(doc: QTextDocument):
    return [f for f in doc.rootFrame().childFrames() if f.format().isTableFormat()]


def test_tables_have_a_grid_and_padding(parley):
    """The grid is the table's own colour showing between its cells (1 px of cell spacing), which take the answer's
    colour (4b389f1: collapsed borders cost Qt ~3x the layout and ~5x the drawing)."""
    doc = _render(parley, "| a | b |\n|---|---|\n| 1 | 2 |\n")
    tables = [t for t in _tables(doc) if t.rows() == 2]
    assert tables
    fmt = tables[0].format().toTableFormat()
    cell = tables[0].cellAt(1, 1).format().toTableCellFormat().background().color()
    assert fmt.cellSpacing() >= 1 and fmt.cellPadding() >= 3
    assert cell.isValid() and fmt.background().color() != cell


def test_inline_and_display_math_is_typeset(parley):
    doc = _render(parley, "Euler: $e^{i\\pi} + 1 = 0$ and $x_1^2 \\le \\alpha$\n\n$$\\frac{a}{b} \\cdot \\sqrt{2}$$")
    text = doc.toPlainText()
    assert "$" not in text and "\\" not in text
    assert ("eⁱπ" in text or "eiπ" in text) and "x₁²" in text and "≤ α" in text and "√" in text and "⋅" in text


def test_block_quotes_have_a_bar(parley):
    doc = _render(parley, "> quoted words\n")
    doc.setTextWidth(400)
    image = QImage(400, int(doc.size().height()) + 4, QImage.Format.Format_RGB32)
    image.fill(QColor("white"))
    painter = QPainter(image)
    doc.drawContents(painter)
    painter.end()
    quote = doc.find("quoted words")
    line = doc.documentLayout().blockBoundingRect(quote.block())
    assert line.left() >= 6, "the quote's text is not indented past a bar"
    rows = range(int(line.top()) + 2, int(line.bottom()) - 2)
    bar = [x for x in range(0, int(line.left())) if all(image.pixelColor(x, y).lightness() < 235 for y in rows)]
    assert len(bar) >= 2, "no vertical bar beside the quote"


# -- 11: one TTFT, and the status line follows the version on screen
def test_ttft_does_not_change_and_status_follows_the_version(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=3)
    seen: list[str] = []
    parley.service.status_changed.connect(lambda _c: seen.extend(_ttfts(w.chat.status.text.full_text())))
    w.chat.send("time me")
    wait_idle(parley, qtbot, conv)
    first = last(parley, conv)
    assert set(seen) == {f"{first.stats['ttft_s'] * 1000:.0f}"}
    configure(parley, conv, max_tokens=30, repetition_penalty=1.0)
    w.chat.view.activate(first, "regen:")
    wait_idle(parley, qtbot, conv)
    second = last(parley, conv)
    assert second.stats["context_used"] != first.stats["context_used"]
    w.chat.view.activate(second, "prev:")
    assert w.chat.status.meter.value() == first.stats["context_used"]
    assert _ttfts(w.chat.status.text.full_text()) == [f"{first.stats['ttft_s'] * 1000:.0f}"]
    w.chat.view.activate(first, "next:")
    assert w.chat.status.meter.value() == second.stats["context_used"]


# -- 12: About names the version (the CLI's --version is in test_cli_gui.py)
def test_about_names_the_version(parley):
    from app.core.version import parley_version
    from app.qt.about import about_html

    assert re.fullmatch(r"\d+\.\d+\.\d+.*", parley_version())
    assert f"Version {parley_version()}" in about_html(parley.models)


# -- 14: an identical copy of a model is not loaded twice
def test_an_identical_copy_of_a_model_is_not_loaded_again(parley, qtbot, tiny_models, tmp_path):
    models = parley.models
    original = models.import_path(tiny_models["llama"].gguf_path)
    qtbot.waitUntil(lambda: models.registry.get(original) is not None, timeout=60_000)
    copy = tmp_path / "my llama copy.gguf"
    shutil.copyfile(tiny_models["llama"].gguf_path, copy)
    loads, real = [], parley.bridge.engine.load_model
    parley.bridge.engine.load_model = lambda *args, **kw: loads.append(args) or real(*args, **kw)
    imported = []
    models.imported.connect(imported.append)
    models.import_path(copy)
    qtbot.waitUntil(lambda: imported == [original], timeout=10_000)  # once its check is back, off the GUI thread
    qtbot.wait(50)
    assert loads == [] and imported == [original]
    assert [e.key for e in models.registry.entries()].count(original) == 1 and len(models.registry.entries()) == 2
    assert "already" in parley.window.statusBar().currentMessage().lower()


# -- issue 23, item 1: a Markdown image never makes the renderer read a file
def test_markdown_images_never_read_files(parley, tmp_path):
    picture = tmp_path / "picture.png"
    image = QImage(64, 64, QImage.Format.Format_RGB32)
    image.fill(QColor("red"))
    assert image.save(str(picture))
    texts = [f"![x](/dev/zero) and ![y]({picture})", f"![y](file://{picture})", f'<img src="{picture}">']
    for text in texts:
        doc = _render(parley, text)
        for url in (QUrl.fromLocalFile(str(picture)), QUrl(str(picture)), QUrl("/dev/zero")):
            assert doc.resource(QTextDocument.ResourceType.ImageResource.value, url) is None
        assert "x" in doc.toPlainText() or "y" in doc.toPlainText() or "img" in doc.toPlainText()
    # Even HTML that names a file (the delegate's documents never load resources).
    from app.qt.chat_view import SafeDocument

    doc = SafeDocument()
    doc.setHtml(f'<img src="{picture}" width="64" height="64">')
    doc.setTextWidth(200)
    doc.size()
    assert doc.resource(QTextDocument.ResourceType.ImageResource.value, QUrl(str(picture))) is None


# -- the rough edges ("Also:")
def test_loading_shows_time_passing_and_a_moving_bar(parley, qtbot):
    from app.core.model_registry import ModelEntry
    from app.qt.model_manager import ModelState

    w, models = parley.window, parley.models
    entry = ModelEntry("/models/big.gguf", "big", "/models/big.gguf", "gguf")  # a load that reports no progress
    models.states[entry.key] = state = ModelState(entry, stage="Reading model file")
    state.started -= 12
    models.changed.emit(entry.key)
    assert w.load_progress.isVisible() and w.load_progress.maximum() == 0  # busy: the bar moves by itself
    assert "Reading model file" in w.load_label.full_text() and "12 s" in w.load_label.full_text()
    state.started -= 3
    qtbot.waitUntil(lambda: "15 s" in w.load_label.full_text(), timeout=3000)  # no new event: the seconds still count
    state.fraction = 0.4
    models.changed.emit(entry.key)
    assert w.load_progress.maximum() == 100 and w.load_progress.value() == 40
    state.status = "loaded"
    models.changed.emit(entry.key)
    assert not w.load_progress.isVisible()


def test_ttft_shows_with_the_first_token_not_at_the_end(parley, qtbot):
    """The line read "TTFT …" beside tokens already flowing: the engine's figure came only with the turn's end."""
    w, service = parley.window, parley.service
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=8)
    streaming: list[str] = []
    service.status_changed.connect(
        lambda c: streaming.append(w.chat.status.text.full_text()) if service.status(c).state == "streaming" else None)
    w.chat.send("count with me")
    wait_idle(parley, qtbot, conv)
    answer = last(parley, conv)
    assert streaming and all("TTFT …" not in line for line in streaming)
    assert {t for line in streaming for t in _ttfts(line)} == {f"{answer.stats['ttft_s'] * 1000:.0f}"}
    assert 0 < answer.stats["engine_ttft_s"] <= answer.stats["ttft_s"]  # the engine's starts later, ends earlier


def test_prompt_reading_shows_its_size_and_time(parley, qtbot):
    from app.qt.status_line import describe

    w, service = parley.window, parley.service
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=2)
    phases = []
    service.status_changed.connect(lambda c: phases.append(describe(service.status(c))))
    w.chat.send("word " * 100)
    wait_idle(parley, qtbot, conv)
    reading = [p for p in phases if "reading the prompt" in p]
    assert reading and re.search(r"reading the prompt \(\d{3} tokens\) · \d+ s", reading[-1])
    assert all("TTFT …" in p for p in reading)


def test_delete_can_be_undone(parley, qtbot):
    w, service = parley.window, parley.service
    a = w.current()
    service.rename(a, "Keep me")
    parley.store.add_message(a, None, "user", "precious")
    b = w.new_chat()
    w.open_chat(a)
    w.delete_current()
    assert a not in w.sidebar.ids() and w.current() == b
    assert w.undo_button.isVisible() and "Keep me" in w.statusBar().currentMessage()
    w.shortcuts["Ctrl+Shift+Z"].trigger()
    assert a in w.sidebar.ids() and w.current() == a and parley.store.path(a)[0].content == "precious"
    w.delete_chat(a)
    w._undo_timer.timeout.emit()  # the undo window closes: deleted for good
    assert not parley.store.has(a) and not w.undo_button.isVisible()


def test_delete_key_moves_on_to_the_next_chat(parley, qtbot):
    """Like any list: Delete selects the chat below (above, for the last), so a second Delete takes that one."""
    w = parley.window
    for i in range(3):
        parley.service.rename(w.new_chat(), f"chat {i}")
    ids = w.sidebar.ids()  # newest first
    w.activateWindow()
    w.sidebar.list.setFocus()
    qtbot.waitUntil(w.sidebar.list.hasFocus)
    w.sidebar.list.setCurrentIndex(w.sidebar.model.index(1, 0))
    for expected in ids[2], ids[3], ids[0]:
        qtbot.keyClick(w.sidebar.list, Qt.Key.Key_Delete)
        assert w.current() == expected and w.sidebar.current_id() == expected


def _link_x(doc: QTextDocument, text: str) -> float:
    doc.size()  # lays the document out
    cursor = doc.find(text)
    assert not cursor.isNull(), text
    block = cursor.block()
    pos = cursor.selectionStart() - block.position()
    line = block.layout().lineForTextPosition(pos)
    x = line.cursorToX(pos)
    return doc.documentLayout().blockBoundingRect(block).left() + (x[0] if isinstance(x, tuple) else x)


def test_action_links_stay_put(parley):
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "q")
    answer = store.add_message(conv, user.id, "assistant", "", state="waiting")
    w.open_chat(conv)
    delegate = w.chat.view.delegate
    xs = []
    for content, state, stats in [("", "waiting", None), ("partial", "streaming", None),
                                  ("partial answer", "done", {"reason": "stop"}),
                                  ("partial answer", "stopped", {"reason": "cancelled"})]:
        store.update_message(answer.id, content=content, state=state, stats=stats)
        xs.append(_link_x(delegate.document(answer)[0], "Regenerate"))
    assert "Continue" in delegate.document(answer)[0].toPlainText()
    assert max(xs) - min(xs) < 1, xs


def test_menus_show_shortcuts(parley):
    w = parley.window
    shown = {a.text(): a.shortcut().toString() for menu in w.menuBar().findChildren(type(w.menuBar().addMenu("x")))
             for a in menu.actions() if not a.isSeparator()}
    for text, key in [("New chat", "Ctrl+N"), ("Settings…", "Ctrl+,"), ("Stop", "Ctrl+."), ("Compare models", "Ctrl+K"),
                      ("Next chat", "Ctrl+Tab"), ("Quit", "Ctrl+Q")]:
        assert shown.get(text) == key, (text, shown.get(text))


def test_escape_stops_from_anywhere_in_the_window(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=400)
    hold_engine(parley, 1.0)
    assert w.chat.send("go on and on")
    w.activateWindow()
    w.sidebar.list.setFocus()
    qtbot.waitUntil(w.sidebar.list.hasFocus)
    qtbot.keyClick(w.sidebar.list, Qt.Key.Key_Escape)
    wait_idle(parley, qtbot, conv)
    assert last(parley, conv).state == "stopped" and (last(parley, conv).stats or {}).get("completion_tokens", 0) < 400
    hold_engine(parley, 1.0)
    assert w.chat.send("and again")
    w.chat.view.setFocus()
    qtbot.waitUntil(w.chat.view.hasFocus)
    qtbot.keyClick(w.chat.view, Qt.Key.Key_Escape)  # from the messages too
    wait_idle(parley, qtbot, conv)
    assert last(parley, conv).state == "stopped"


def test_escape_in_the_search_box_clears_it_first(parley, qtbot):
    """Esc clears a search and the answer goes on; a second Esc (the box empty) stops it, as anywhere else."""
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=400)
    hold_engine(parley, 1.0)
    assert w.chat.send("go on and on")
    w.activateWindow()
    w.sidebar.search.setFocus()
    qtbot.waitUntil(w.sidebar.search.hasFocus)
    qtbot.keyClicks(w.sidebar.search, "go")
    qtbot.keyClick(w.sidebar.search, Qt.Key.Key_Escape)
    assert w.sidebar.search.text() == "" and parley.service.busy(conv)
    qtbot.keyClick(w.sidebar.search, Qt.Key.Key_Escape)
    wait_idle(parley, qtbot, conv)
    assert last(parley, conv).state == "stopped"


def test_tab_leaves_the_composer(parley, qtbot):
    w = parley.window
    w.activateWindow()
    edit = w.chat.composer.edit
    edit.setFocus()
    qtbot.waitUntil(edit.hasFocus)
    qtbot.keyClicks(edit, "hi")
    qtbot.keyClick(edit, Qt.Key.Key_Tab)
    assert edit.toPlainText() == "hi" and not edit.hasFocus()


def test_send_and_stop_by_keyboard_leave_the_focus_in_the_composer(parley, qtbot):
    """Space on Send or Stop hides it: the focus goes to the message box, not on to New chat (a second Space)."""
    w = parley.window
    conv = w.current()
    composer = w.chat.composer
    configure(parley, conv, temperature=0.0, max_tokens=400)
    w.activateWindow()
    composer.edit.setPlainText("go on and on")
    hold_engine(parley, 1.0)
    for button in composer.send_button, composer.stop_button:
        button.setFocus()
        qtbot.waitUntil(button.hasFocus)
        qtbot.keyClick(button, Qt.Key.Key_Space)
        qtbot.waitUntil(lambda: not button.isVisible())  # Stop hides when the answer has stopped
        assert composer.edit.hasFocus(), f"{button.text()}: focus went to {w.focusWidget()!r}"
    assert last(parley, conv).state == "stopped" and w.current() == conv


def test_messages_and_controls_have_accessible_names(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=3)
    w.chat.send("hello there")
    wait_idle(parley, qtbot, conv)
    model = w.chat.view.model()
    names = [model.data(model.index(r), Qt.ItemDataRole.AccessibleTextRole) for r in range(model.rowCount())]
    assert names[0] == "You: hello there"
    assert names[1].startswith("qwen3") and names[1].endswith(last(parley, conv).content)
    for widget in (w.chat.composer.edit, w.chat.picker, w.chat.settings_button, w.chat.view, w.sidebar.list,
                   w.sidebar.search, w.chat.status.meter):
        assert widget.accessibleName(), widget


def test_empty_chat_explains_the_base_model_and_offers_prompts(parley, qtbot):
    w = parley.window
    conv = w.new_chat()
    assert w.chat.body.currentWidget() is w.chat.empty
    assert "base model" in w.chat.empty.note.text() and "Import GGUF" in w.chat.empty.note.text()
    assert len(w.chat.empty.buttons) >= 3
    qtbot.mouseClick(w.chat.empty.buttons[0], Qt.MouseButton.LeftButton)
    text = w.chat.composer.edit.toPlainText()
    assert text == w.chat.empty.buttons[0].property("prompt") and parley.store.path(conv) == []
    configure(parley, conv, max_tokens=3)
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    assert w.chat.body.currentWidget() is w.chat.view
    wait_idle(parley, qtbot, conv)


def test_window_size_and_place_are_restored(qtbot, qapp, tiny_models, tmp_path):
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    app.window.resize(760, 560)  # the offscreen screen is 800 wide: Qt fits a restored window onto a screen
    app.window.splitter.setSizes([300, 460])
    qtbot.wait(20)
    app.close()
    again = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        assert (again.window.width(), again.window.height()) == (760, 560)
        assert abs(again.window.splitter.sizes()[0] - 300) <= 2
    finally:
        again.close()


def test_a_first_window_fits_a_small_screen(qtbot, qapp, tiny_models, tmp_path):
    """No saved geometry: it opened 1200×780 on any screen, its right edge and bottom off the offscreen 800×600."""
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        room = app.window.screen().availableGeometry()
        assert room.width() < 1200 and room.contains(app.window.frameGeometry())
    finally:
        app.close()


def test_a_first_window_keeps_its_size_where_the_screen_has_room():
    from PySide6.QtCore import QMargins, QRect

    from app.qt.window import FIRST_SIZE, first_geometry

    frame = QMargins(4, 24, 4, 4)
    assert first_geometry(QRect(0, 0, 1920, 1040), FIRST_SIZE, frame) is None  # placed by the window system
    assert first_geometry(QRect(0, 0, 1208, 808), FIRST_SIZE, frame) is None
    laptop = first_geometry(QRect(0, 0, 1366, 728), FIRST_SIZE, frame)  # 768 less a 40 px panel
    assert laptop == QRect(83, 24, 1200, 700)
    netbook = first_geometry(QRect(1366, 0, 1024, 600), FIRST_SIZE, frame)  # a second screen, right of the first
    assert netbook == QRect(1370, 24, 1016, 572)


def test_the_chat_open_at_close_is_open_after_a_restart(qtbot, qapp, tiny_models, tmp_path):
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    older = app.window.current()
    app.service.rename(older, "older")
    app.service.rename(app.window.new_chat(), "newer")  # the top of the list
    app.window.open_chat(older)
    app.close()
    again = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        assert again.window.current() == older
        assert again.window.sidebar.current_id() == older
    finally:
        again.close()


def test_context_limit_says_why(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=2)
    w.chat.send("hi")
    wait_idle(parley, qtbot, conv)
    tip = w.chat.status.meter.toolTip()
    assert "512 tokens" in tip and "4 chats answering at once" in tip


def test_live_panel_lists_every_generation_and_stops_one(parley, qtbot):
    w = parley.window
    convs = [w.current(), w.new_chat(), w.new_chat()]
    for conv in convs:
        configure(parley, conv, temperature=0.0, max_tokens=400)
    w.shortcuts["Ctrl+Shift+L"].trigger()
    panel = w.live_panel
    assert panel.isVisible()
    hold_engine(parley, 2.0)  # the three turns stay live long enough to look at
    for conv in convs:
        w.open_chat(conv)
        w.chat.send("tell me everything")
    qtbot.waitUntil(lambda: panel.table.topLevelItemCount() == 3, timeout=5000)
    rows = {r[0]: r for r in panel.rows()}
    assert set(rows) == set(convs) and all(r[2] and r[3] for r in rows.values())  # model and state for each
    assert "(3)" in panel.windowTitle()
    panel.table.setCurrentItem(panel.table.topLevelItem(1))
    chosen = panel.table.currentItem().data(0, Qt.ItemDataRole.UserRole)
    panel.open_button.click()
    assert w.current() == chosen
    panel.stop_button.click()
    panel.stop_all_button.click()
    wait_idle(parley, qtbot, *convs)
    assert {last(parley, c).state for c in convs} == {"stopped"}
    qtbot.waitUntil(lambda: panel.table.topLevelItemCount() == 0, timeout=5000)


def test_every_message_action_has_a_keyboard_path(parley, qtbot):
    w = parley.window
    conv = w.current()
    # seeded: unseeded, 4 hot draws from the tiny model once decoded to no text (CI), an answer with nothing to copy
    configure(parley, conv, temperature=1.5, top_k=0, top_p=1.0, max_tokens=4, seed=3)
    w.chat.send("a question")
    wait_idle(parley, qtbot, conv)
    first = last(parley, conv)
    view = w.chat.view
    w.activateWindow()
    view.setFocus()
    qtbot.waitUntil(view.hasFocus)
    assert view.currentIndex().row() == 1  # the latest message is current
    qtbot.keyClick(view, Qt.Key.Key_Return)
    labels = [a.text() for a in view.last_menu.actions()]
    assert {"Copy", "Regenerate"} <= set(labels) and any(t.startswith("Regenerate with seed ") for t in labels)
    next(a for a in view.last_menu.actions() if a.text() == "Regenerate").trigger()
    wait_idle(parley, qtbot, conv)
    assert parley.store.versions(last(parley, conv)) == [first, last(parley, conv)]
    qtbot.keyClick(view, Qt.Key.Key_Home)
    assert view.currentIndex().row() == 0
    qtbot.keyClick(view, Qt.Key.Key_Menu)
    assert [a.text() for a in view.last_menu.actions()] == ["Copy", "Edit"]
    view.last_menu.close()


def test_version_arrows_are_big_enough_to_hit(parley):
    from PySide6.QtCore import QPointF

    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "q")
    store.add_message(conv, user.id, "assistant", "one")
    second = store.add_message(conv, user.id, "assistant", "two")
    w.open_chat(conv)
    doc = w.chat.view.delegate.document(second)[0]
    layout = doc.documentLayout()
    y = layout.blockBoundingRect(doc.find("2/2").block()).center().y()
    hits = [x for x in range(int(doc.textWidth())) if layout.anchorAt(QPointF(x, y)) == "prev:"]
    assert len(hits) >= 16, f"the previous-version arrow is {len(hits)} px wide"


def test_each_answer_shows_its_seed_and_can_be_drawn_again(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=1.5, top_k=0, top_p=1.0, seed=None, max_tokens=16)
    w.chat.send("surprise me")
    wait_idle(parley, qtbot, conv)
    first = last(parley, conv)
    seed = first.stats["seed"]
    assert isinstance(seed, int) and f"seed {seed}" in w.chat.view.delegate.document(first)[0].toPlainText()
    assert parley.bridge.engine.sent[-1]["params"].seed == seed
    w.chat.view.activate(first, "regen:")  # a fresh seed: another answer
    wait_idle(parley, qtbot, conv)
    other = last(parley, conv)
    assert other.stats["seed"] != seed and other.content != first.content
    menu = w.chat.view.show_actions(w.chat.view.model().index(1, 0), QPoint(0, 0))
    assert f"Regenerate with seed {other.stats['seed']}" in [a.text() for a in menu.actions()]
    menu.close()
    w.chat.view.activate(other, f"regen-seed:{seed}")  # the first answer's seed: the first answer again
    wait_idle(parley, qtbot, conv)
    again = last(parley, conv)
    assert again.stats["seed"] == seed and again.content == first.content
    assert parley.store.get(conv).settings.seed is None  # the chat's own setting is untouched


def test_a_second_chat_with_the_same_system_prompt_reuses_its_prefill(parley, qtbot):
    """The prefix cache: a new chat that shares a long system prompt with an open one computes only what differs,
    and its status line says how much came from the cache."""
    from app.qt.status_line import describe

    w, service = parley.window, parley.service
    system = "You are a careful assistant who answers about lighthouses. " * 4
    a = w.current()
    configure(parley, a, temperature=0.0, max_tokens=2, system_prompt=system)
    w.chat.send("Tell me one fact.")
    wait_idle(parley, qtbot, a)
    b = w.new_chat()
    configure(parley, b, temperature=0.0, max_tokens=2, system_prompt=system)
    w.open_chat(b)
    w.chat.send("Tell me another fact.")
    wait_idle(parley, qtbot, b)
    status = service.status(b)
    assert status.prompt_tokens > 50 and status.prompt_tokens - status.prefilled_tokens > 50
    assert "prompt tokens cached" in describe(status)


def test_settings_that_cannot_be_saved_say_so_once(parley, tmp_path):
    """A theme or preset change on a full disk or an unwritable folder was dropped without a word."""
    w = parley.window
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x", encoding="utf-8")
    good = w.app_settings.file
    w.app_settings.file = blocker / "settings.json"  # its folder cannot be made: the save fails as a full disk's does
    w._save_theme("dark")
    shown = w.statusBar().currentMessage()
    assert shown.startswith("Settings not saved: ") and "settings.json" in shown
    w.statusBar().clearMessage()
    w._save_one_at_a_time(True)
    assert w.statusBar().currentMessage() == ""  # said once, not at every later save
    w.app_settings.file = good
    w._save_theme("light")
    assert w.app_settings.save_error == ""
