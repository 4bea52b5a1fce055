"""Compare view: one prompt to several columns, each with its own model and history; one-at-a-time; promote."""
from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QPoint, Qt

from tests.app.helpers import handed, hold_engine, wait_idle


def _columns(app, n: int = 2, **settings):
    view = app.window.compare
    app.window.show_compare()
    view.set_columns(n)
    for column in view.columns:
        conv = app.store.get(column.conv_id)
        app.service.set_settings(column.conv_id, conv.settings.copy(temperature=0.0, max_tokens=6, **settings))
    return view


def test_compare_two_models_side_by_side(parley, qtbot, imported_llama):
    view = _columns(parley)
    view.columns[1].set_model(imported_llama)
    convs = [c.conv_id for c in view.columns]
    assert [parley.store.get(c).settings.model for c in convs] == ["default", imported_llama]
    assert view.send("compare this")
    assert all(parley.service.busy(c) for c in convs)
    wait_idle(parley, qtbot, *convs)
    answers = [parley.store.path(c)[-1] for c in convs]
    assert [a.model for a in answers] == [parley.models.registry.get(k).name for k in ("default", imported_llama)]
    assert all(a.state == "done" for a in answers)
    for column in view.columns:
        assert "tok/s" in column.stats.text() and "TTFT" in column.stats.text() and "TTFT —" not in column.stats.text()
    # A follow-up goes to every column, each with its own history.
    assert view.send("and a follow-up")
    wait_idle(parley, qtbot, *convs)
    for conv in convs:
        path = parley.store.path(conv)
        assert [m.content for m in path][::2] == ["compare this", "and a follow-up"]
        assert handed(parley, conv) == [m.content for m in path][:-1]
    assert parley.store.path(convs[0])[1].content != parley.store.path(convs[1])[1].content
    # Compare columns are not chats until promoted.
    assert not set(convs) & set(parley.window.sidebar.ids())
    view.columns[1].promote_button.click()
    assert parley.window.current() == convs[1] and convs[1] in parley.window.sidebar.ids()
    assert view.columns[1].conv_id != convs[1] and parley.store.path(view.columns[1].conv_id) == []
    assert parley.window.chat.view.model().rowCount() == 4


def test_one_at_a_time_mode(parley, qtbot):
    view = _columns(parley, 3)
    view.one_at_a_time.setChecked(True)
    convs = [c.conv_id for c in view.columns]
    running: list[set[int]] = []
    parley.service.status_changed.connect(lambda _c: running.append({c for c in convs if parley.service.busy(c)}))
    assert view.send("in turn")
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert max(len(r) for r in running) == 1
    assert all(parley.store.path(c)[-1].state == "done" for c in convs)


def test_column_count_and_stop(parley, qtbot):
    view = _columns(parley, 4, )
    assert len(view.columns) == 4 and view.count.value() == 4
    for column in view.columns:
        parley.service.set_settings(column.conv_id, parley.store.get(column.conv_id).settings.copy(max_tokens=400))
    view.send("long")
    qtbot.waitUntil(lambda: all(parley.store.path(c.conv_id)[-1].content for c in view.columns), timeout=60_000)
    view.stop()
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert {parley.store.path(c.conv_id)[-1].state for c in view.columns} == {"stopped"}
    view.set_columns(2)
    assert len(view.columns) == 2


def test_columns_are_labelled_with_model_and_differing_settings(parley, imported_llama):
    view = _columns(parley, 3)
    view.columns[1].set_model(imported_llama)
    conv = view.columns[2].conv_id
    parley.service.set_settings(conv, parley.store.get(conv).settings.copy(temperature=0.2))
    labels = [c.label.full_text() for c in view.columns]
    qwen3, llama = (parley.models.registry.get(k).name for k in ("default", imported_llama))  # as the pickers list them
    assert labels == [f"A: {qwen3} · T 0", f"B: {llama} · T 0", f"C: {qwen3} · T 0.2"]


def test_enter_while_columns_answer_queues_the_prompt(parley, qtbot):
    view = _columns(parley, 2)
    for column in view.columns:
        parley.service.set_settings(column.conv_id, parley.store.get(column.conv_id).settings.copy(max_tokens=40))
    hold_engine(parley, 1.0)
    assert view.send("first")
    view.composer.edit.setPlainText("second")
    qtbot.keyClick(view.composer.edit, Qt.Key.Key_Return)
    assert view.queued.isVisibleTo(parley.window) and "second" in view.queued.text()
    assert view.composer.edit.toPlainText() == ""
    convs = [c.conv_id for c in view.columns]
    qtbot.waitUntil(lambda: all(len(parley.store.path(c)) == 4 for c in convs), timeout=60_000)
    wait_idle(parley, qtbot, *convs)
    for conv in convs:
        assert [m.content for m in parley.store.path(conv)][::2] == ["first", "second"]
    assert not view.queued.isVisibleTo(parley.window)


def test_new_comparison_keeps_the_old_one_to_reopen(parley, qtbot):
    view = _columns(parley, 2)
    assert view.send("the old question")
    old = [c.conv_id for c in view.columns]
    wait_idle(parley, qtbot, *old)
    view.clear_button.click()
    assert [c.conv_id for c in view.columns] != old and all(parley.store.path(c.conv_id) == [] for c in view.columns)
    view._fill_menu()
    titles = [a.text() for a in view.more.menu().actions()]
    assert "the old question" in titles
    fresh = [c.conv_id for c in view.columns]
    next(a for a in view.more.menu().actions() if a.text() == "the old question").trigger()
    assert [c.conv_id for c in view.columns] == old
    assert not any(parley.store.has(c) for c in fresh)  # an empty comparison is not kept


def test_export_and_diff_of_a_comparison(parley, qtbot, imported_llama):
    view = _columns(parley, 2)
    view.columns[1].set_model(imported_llama)
    assert view.send("say something")
    wait_idle(parley, qtbot, *(c.conv_id for c in view.columns))
    answers = [view.last_answer(c) for c in view.columns]
    text = view.export_markdown()
    assert "# Comparison: say something" in text and "> say something" in text
    assert "### A: qwen3" in text and "### B: llama" in text
    assert all(a in text for a in answers)
    thoughts = ["<think>\nmaybe a cat\n</think>\n\n", "<think>\ndogs are nice\n</think>\n\n"]  # not compared
    for column, words, thought in zip(view.columns, ["the cat sat on the mat", "the dog sat on a mat"], thoughts):
        parley.store.update_message(parley.store.path(column.conv_id)[-1].id, content=thought + words)
    dialog = view.show_diff()
    assert "the cat sat on the mat" not in dialog.text.toPlainText()  # interleaved, word by word
    assert "maybe" not in dialog.text.toPlainText() and "nice" not in dialog.text.toPlainText()
    struck = {w: dialog.text.document().find(w).charFormat().fontStrikeOut() for w in ("cat", "dog", "sat", "mat")}
    assert struck == {"cat": True, "dog": False, "sat": False, "mat": False}
    assert "%" in dialog.summary.text()
    dialog.close()


def test_scrolling_one_column_scrolls_the_others(parley, qtbot):
    view = _columns(parley, 2)
    parley.window.resize(1000, 600)
    for column in view.columns:
        parent = None
        for i in range(12):
            role = "user" if i % 2 == 0 else "assistant"
            parent = parley.store.add_message(column.conv_id, parent, role, f"turn {i // 2} " + "word " * 60).id
        column.view.set_conversation(column.conv_id)
    qtbot.wait(50)
    a, b = (c.view for c in view.columns)
    assert a.verticalScrollBar().maximum() > 0
    a.scrollTo(a.model().index(4, 0), a.ScrollHint.PositionAtTop)
    a.verticalScrollBar().triggerAction(a.verticalScrollBar().SliderAction.SliderSingleStepSub)
    qtbot.waitUntil(lambda: b.indexAt(QPoint(4, 4)).row() == a.indexAt(QPoint(4, 4)).row(), timeout=2000)
    assert b.indexAt(QPoint(4, 4)).row() < 11


def test_fewer_columns_keep_a_removed_columns_answers(parley, qtbot):
    view = _columns(parley, 3)
    assert view.send("keep this")
    convs = [c.conv_id for c in view.columns]
    wait_idle(parley, qtbot, *convs)
    view.count.setValue(2)
    assert len(view.columns) == 2
    assert parley.store.has(convs[2]) and not parley.store.get(convs[2]).hidden
    assert convs[2] in parley.window.sidebar.ids() and "Column C" in view.queued.text()
    view.count.setValue(3)
    view.count.setValue(2)  # an empty column just goes
    assert len(parley.store.conversations(include_hidden=True)) == 1 + 3
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # the removed columns' widgets are gone
    key = parley.store.get(convs[0]).settings.model
    parley.models.changed.emit(key)  # a load's progress: only the live columns listen (a dead one's label raised)


def test_presets_apply_to_a_chat_and_a_column_and_survive_a_restart(parley, qtbot, tiny_models, tmp_path):
    """A named system prompt + sampling preset, saved from one chat's settings, fills another chat's or a compare
    column's settings (each keeps its own model) and is still there after a restart."""
    from app.qt.settings_dialog import SettingsDialog
    from tests.app.helpers import start_app

    w = parley.window
    conv = w.current()
    dialog = SettingsDialog(parley.models.registry, parley.store.get(conv).settings, parent=w, presets=w.presets)
    form = dialog.form
    form.system.setPlainText("Answer in one short sentence.")
    form.temperature.setValue(0.2)
    form.top_k.setValue(40)
    assert form.save_as_preset("  Terse   answers ") == "Terse answers"
    dialog.reject()
    w.show_compare()
    column = w.compare.columns[1]
    before = parley.store.get(column.conv_id).settings
    col_dialog = SettingsDialog(parley.models.registry, before, parent=w, presets=column.presets)
    col_dialog.form.preset.setCurrentIndex(col_dialog.form.preset.findData("Terse answers"))
    col_dialog.form._apply_preset()
    got = col_dialog.settings()
    assert (got.system_prompt, got.temperature, got.top_k, got.model) == ("Answer in one short sentence.", 0.2, 40,
                                                                          before.model)
    parley.close()
    again = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        assert again.window.presets.names() == ["Terse answers"]
        assert again.window.presets.get("Terse answers").top_k == 40
    finally:
        again.close()


def test_column_labels_name_what_differs_and_what_matters():
    from app.core.chat_settings import ChatSettings, differences

    assert differences([ChatSettings(), ChatSettings(repeat_last_n=-1)]) == [["rep window 64"], ["rep window all"]]
    # a seed or a top-p means nothing at temperature 0: "T 0 · seed random" read as if the column drew at random
    greedy, drawn = ChatSettings(temperature=0.0), ChatSettings(temperature=0.8, seed=7, top_p=0.5)
    assert differences([greedy, drawn]) == [["T 0"], ["T 0.8"]]
    assert differences([greedy, drawn, ChatSettings(temperature=0.8)]) == [["T 0"], ["T 0.8", "top-p 0.5", "seed 7"],
                                                                           ["T 0.8", "top-p 0.95", "seed random"]]
    assert ChatSettings().sampling().repeat_last_n == 64


def test_stop_stops_what_the_page_shows_and_lets_the_other_page_answer(parley, qtbot):
    """Ctrl+. on the chat page stops the chat on screen, the comparison's columns answering out of sight go on; on
    the compare page it stops every column (and what waits for them), the chat out of sight goes on."""
    w, s = parley.window, parley.service
    view = _columns(parley, 2)
    chat = w.chat.conv_id
    columns = [c.conv_id for c in view.columns]
    for conv in (chat, *columns):
        s.set_settings(conv, parley.store.get(conv).settings.copy(temperature=0.0, max_tokens=8))
    w.activateWindow()
    for page, stopped, going in (("chat", [chat], columns), ("compare", columns, [chat])):
        hold_engine(parley, 1.0)  # every turn is live when the key is pressed
        assert view.send("go on and on")
        w.open_chat(chat)
        assert w.chat.send("and on")
        if page == "compare":
            w.show_compare()
        focus = w.chat.composer.edit if page == "chat" else view.columns[1].view
        focus.setFocus()
        qtbot.waitUntil(focus.hasFocus)
        qtbot.keyClick(focus, Qt.Key.Key_Period, Qt.KeyboardModifier.ControlModifier)
        wait_idle(parley, qtbot, chat, *columns)
        assert [parley.store.path(c)[-1].state for c in stopped] == ["stopped"] * len(stopped), page
        assert "stopped" not in [parley.store.path(c)[-1].state for c in going], page
