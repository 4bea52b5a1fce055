"""The main window on the engine thread (tiny Qwen3): streaming, concurrency, stop, versions, branches, settings."""
from __future__ import annotations

from PySide6.QtCore import Qt

from tests.app.helpers import configure, handed, hold_engine, last, last_turn, wait_idle


def test_two_chats_stream_at_once(parley, qtbot):
    w, service = parley.window, parley.service
    a = w.current()
    b = w.new_chat()
    for conv in (a, b):
        configure(parley, conv, temperature=0.0, max_tokens=24)
    streaming: set[int] = set()
    overlap = []

    def on_status(conv_id: int) -> None:
        if service.status(conv_id).state == "streaming":
            streaming.add(conv_id)
        else:
            streaming.discard(conv_id)
        if {a, b} <= streaming:
            overlap.append(True)

    service.status_changed.connect(on_status)
    w.open_chat(a)
    assert w.chat.send("hello from a")
    w.open_chat(b)  # switching while a streams
    assert w.chat.send("hello from b")
    w.open_chat(a)
    assert w.chat.view.model().rowCount() == 2
    wait_idle(parley, qtbot, a, b)
    assert overlap, "the two chats never streamed at the same time"
    for conv in (a, b):
        answer = last(parley, conv)
        assert answer.role == "assistant" and answer.state == "done" and answer.content
        assert answer.stats["completion_tokens"] > 0
        status = service.status(conv)
        assert status.context_limit == 512 and 0 < status.context_used <= 512
        assert status.ttft_s is not None
    assert "TTFT" in w.chat.status.text.full_text() and "qwen3" in w.chat.status.text.full_text()
    assert w.chat.status.meter.format().endswith("/ 512")
    assert w.chat.status.meter.value() == service.status(a).context_used


def test_stop_keeps_partial_answer_and_chat_goes_on(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=400)
    w.chat.composer.edit.setPlainText("tell me everything")
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(last(parley, conv).content) > 0, timeout=60_000)
    assert w.chat.composer.stop_button.isVisibleTo(w) and not w.chat.composer.send_button.isVisibleTo(w)
    qtbot.mouseClick(w.chat.composer.stop_button, Qt.MouseButton.LeftButton)
    wait_idle(parley, qtbot, conv)
    answer = last(parley, conv)
    assert answer.state == "stopped" and answer.stats["reason"] == "cancelled"
    assert answer.stats["completion_tokens"] < 400
    assert w.chat.composer.send_button.isVisibleTo(w)
    configure(parley, conv, max_tokens=6)
    assert w.chat.send("and then?")
    wait_idle(parley, qtbot, conv)
    assert last(parley, conv).state == "done"
    assert handed(parley, conv) == [m.content for m in parley.store.path(conv)][:-1]


def test_regenerate_keeps_versions_and_switches(parley, qtbot):
    w, store = parley.window, parley.store
    conv = w.current()
    configure(parley, conv, temperature=1.5, top_k=0, top_p=1.0, max_tokens=8)
    w.chat.send("a question")
    wait_idle(parley, qtbot, conv)
    first = last(parley, conv)
    w.chat.view.activate(first, "regen:")
    wait_idle(parley, qtbot, conv)
    second = last(parley, conv)
    assert second is not first and second.parent_id == first.parent_id
    assert store.versions(second) == [first, second]
    doc, _ = w.chat.view.delegate.document(second)
    assert "2/2" in doc.toPlainText()
    w.chat.view.activate(second, "prev:")
    assert last(parley, conv) is first
    assert w.chat.view.model().message_at(1) is first
    assert "1/2" in w.chat.view.delegate.document(first)[0].toPlainText()
    w.chat.view.activate(first, "next:")
    assert last(parley, conv) is second
    # A follow-up on version 1 reaches the engine with version 1 in its history.
    w.chat.view.activate(second, "prev:")
    w.chat.send("follow-up")
    wait_idle(parley, qtbot, conv)
    assert handed(parley, conv)[:2] == ["a question", first.content]


def test_edit_makes_a_branch_and_the_old_one_stays(parley, qtbot):
    w, store = parley.window, parley.store
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=6)
    for text in ("first", "second"):
        w.chat.send(text)
        wait_idle(parley, qtbot, conv)
    old_path = store.path(conv)
    assert [m.content for m in old_path][::2] == ["first", "second"]
    w.chat.view.activate(old_path[0], "edit:")
    assert w.chat.composer.banner.isVisibleTo(w) and w.chat.composer.edit.toPlainText() == "first"
    w.chat.composer.edit.setPlainText("first, edited")
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    wait_idle(parley, qtbot, conv)
    new_path = store.path(conv)
    assert [m.role for m in new_path] == ["user", "assistant"] and new_path[0].content == "first, edited"
    assert store.versions(new_path[0]) == [old_path[0], new_path[0]]
    assert handed(parley, conv) == [m.content for m in new_path][:-1]
    # Back to the old branch: the whole old conversation is there, and it can go on.
    w.chat.view.activate(new_path[0], "prev:")
    assert store.path(conv) == old_path
    w.chat.send("third")
    wait_idle(parley, qtbot, conv)
    path = store.path(conv)
    assert path[:4] == old_path and path[4].content == "third" and path[5].state == "done"
    assert handed(parley, conv) == [m.content for m in path][:-1]


def test_an_edit_sent_while_the_chat_answers_stops_the_answer_and_goes(parley, qtbot):
    w, store = parley.window, parley.store
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=6)
    w.chat.send("first")
    wait_idle(parley, qtbot, conv)
    first = store.path(conv)[0]
    configure(parley, conv, max_tokens=400)
    hold_engine(parley, 0.5)  # the next answer is still running when the edit is sent
    w.chat.send("second")
    answer = store.path(conv)[-1]
    assert parley.service.busy(conv) and answer.role == "assistant"
    w.chat.view.activate(first, "edit:")
    w.chat.composer.edit.setPlainText("first, edited")
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    assert not w.chat.composer.banner.isVisibleTo(w)  # taken, not silently dropped
    qtbot.waitUntil(lambda: [m.content for m in store.path(conv)][:1] == ["first, edited"], timeout=30_000)
    wait_idle(parley, qtbot, conv)
    assert store.versions(store.path(conv)[0])[0].id == first.id and store.path(conv)[-1].state == "done"
    assert store.message(answer.id).state == "stopped"  # the answer the edit cut short stays on the old branch


def test_settings_take_effect_on_the_next_turn(parley, qtbot):
    from app.qt.settings_dialog import SettingsDialog

    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=40, repetition_penalty=1.0)
    w.chat.send("one")
    wait_idle(parley, qtbot, conv)
    dialog = SettingsDialog(parley.models.registry, parley.store.get(conv).settings, parent=w)
    dialog.form.max_tokens.setValue(3)
    dialog.form.system.setPlainText("Answer in three tokens.")
    dialog.form.temperature.setValue(0.5)
    dialog.form.seed.setValue(7)
    dialog.form.overflow.setCurrentIndex(dialog.form.overflow.findData("stop"))
    dialog.form.thinking.setCurrentIndex(2)  # "Answer without thinking"
    assert dialog.form.repeat_last_n.value() == 64  # a new chat's penalty window, as llama.cpp and Ollama
    dialog.form.repeat_last_n.setValue(-1)
    assert dialog.form.repeat_last_n.text() == "the whole chat"
    w.apply_settings(conv, dialog.settings())
    w.chat.send("two")
    wait_idle(parley, qtbot, conv)
    answer = last(parley, conv)
    assert answer.stats["completion_tokens"] <= 3
    turn = last_turn(parley, conv)
    assert turn["params"].max_tokens == 3 and turn["params"].temperature == 0.5 and turn["params"].seed == 7
    assert turn["params"].thinking is False and turn["params"].repeat_last_n == -1
    assert turn["system"] == "Answer in three tokens." and parley.service.live(conv).overflow == "stop"
    assert handed(parley, conv)[:1] == ["one"]


def test_model_change_takes_effect_on_the_next_turn(parley, qtbot, imported_llama):
    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=5)
    w.chat.send("on qwen")
    wait_idle(parley, qtbot, conv)
    listed = {key: parley.models.registry.get(key).name for key in ("default", imported_llama)}  # as the picker
    assert last(parley, conv).model == listed["default"]
    w.chat.picker.setCurrentIndex(w.chat.picker.findData(imported_llama))
    assert parley.store.get(conv).settings.model == imported_llama
    w.chat.send("on llama")
    wait_idle(parley, qtbot, conv)
    answer = last(parley, conv)
    assert answer.state == "done" and answer.model == listed[imported_llama]
    assert handed(parley, conv) == [m.content for m in parley.store.path(conv)][:-1]


def test_token_updates_are_coalesced(parley, qtbot):
    import time

    w = parley.window
    convs = [w.current()] + [w.new_chat() for _ in range(3)]
    flushes = parley.bridge.flushes
    start = time.perf_counter()
    for conv in convs:
        configure(parley, conv, temperature=0.0, max_tokens=10)
        w.open_chat(conv)
        w.chat.send("stream")
    wait_idle(parley, qtbot, *convs)
    elapsed = time.perf_counter() - start
    tokens = sum(last(parley, c).stats["completion_tokens"] for c in convs)
    assert parley.bridge.flushes - flushes <= 60 * elapsed + 5
    assert parley.bridge.flushes - flushes < tokens + len(convs) * 4


def test_sidebar_rename_pin_delete_search(parley, qtbot):
    w, service = parley.window, parley.service
    a = w.current()
    configure(parley, a, max_tokens=4)
    w.chat.send("about penguins")
    wait_idle(parley, qtbot, a)
    b = w.new_chat()
    service.rename(b, "Groceries")
    service.set_pinned(b, True)
    assert w.sidebar.ids()[0] == b and w.sidebar.model.index(0, 0).data() == "Groceries"
    w.sidebar.search.setText("PENGUIN")  # message text: looked for on a worker
    qtbot.waitUntil(lambda: w.sidebar.ids() == [a])
    w.sidebar.search.setText("grocer")  # title
    qtbot.waitUntil(lambda: w.sidebar.ids() == [b])
    c = w.new_chat()  # the search goes, or the new chat would be missing from the list
    assert w.sidebar.search.text() == "" and c in w.sidebar.ids() and w.sidebar.current_id() == c
    service.delete(c)
    w.open_chat(b)
    service.delete(b)
    assert b not in w.sidebar.ids() and w.current() == a


def test_a_rename_in_progress_survives_another_chat_changing(parley, qtbot):
    """The list waits for the rename editor to close before it refreshes (a queued message's send refreshes it)."""
    w, service = parley.window, parley.service
    other = w.current()
    service.rename(other, "old name")
    busy = w.new_chat()
    configure(parley, busy, max_tokens=4)
    hold_engine(parley, 0.5)
    assert w.chat.send("one") and w.chat.send("two")  # the second waits its turn
    w.sidebar.rename(other)
    editor = w.sidebar.list.indexWidget(w.sidebar.model.index(w.sidebar.ids().index(other), 0))
    qtbot.keyClick(editor, Qt.Key.Key_End)  # the editor opens with the title selected
    qtbot.keyClicks(editor, " NEW")
    qtbot.waitUntil(lambda: not service.busy(busy) and not service.queued(busy), timeout=60_000)
    assert w.sidebar.list.state() == w.sidebar.list.State.EditingState
    qtbot.keyClick(editor, Qt.Key.Key_Return)  # the delegate commits on the next turn of the event loop
    qtbot.waitUntil(lambda: parley.store.get(other).title == "old name NEW")
    assert w.sidebar.model.index(w.sidebar.ids().index(other), 0).data() == "old name NEW"


def test_shortcuts_new_next_previous_compare(parley, qtbot):
    w = parley.window
    first = w.current()
    parley.store.add_message(first, None, "user", "hi")  # Ctrl+N on a chat as New chat made it shows that one
    w.shortcuts["Ctrl+N"].trigger()
    second = w.current()
    assert second != first and w.sidebar.ids()[0] == second
    w.shortcuts["Ctrl+Tab"].trigger()
    assert w.current() == first
    w.shortcuts["Ctrl+Shift+Tab"].trigger()
    assert w.current() == second
    w.shortcuts["Ctrl+K"].trigger()
    assert w.stack.currentWidget() is w.compare
    w.shortcuts["Ctrl+L"].trigger()
    w.open_chat(first)
    assert w.stack.currentWidget() is w.chat


def test_composer_enter_sends_shift_enter_breaks_line(parley, qtbot):
    w = parley.window
    conv = w.current()
    configure(parley, conv, max_tokens=3)
    edit = w.chat.composer.edit
    qtbot.keyClicks(edit, "line one")
    qtbot.keyClick(edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(edit, "line two")
    assert edit.toPlainText() == "line one\nline two"
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    assert edit.toPlainText() == ""
    assert parley.store.path(conv)[0].content == "line one\nline two"
    wait_idle(parley, qtbot, conv)


def test_continue_grows_the_answer_and_a_failure_leaves_it(parley, qtbot, monkeypatch):
    w, service = parley.window, parley.service
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=5)
    assert w.chat.send("tell me more")
    wait_idle(parley, qtbot, conv)
    answer = last(parley, conv)
    first = answer.content
    assert answer.stats["reason"] == "length"  # cut short by max tokens: Continue is offered
    w.chat.view.activate(answer, "continue:")
    wait_idle(parley, qtbot, conv)
    grown = last(parley, conv)
    assert grown.id == answer.id and grown.content.startswith(first) and len(grown.content) > len(first)
    assert handed(parley, conv) == [m.content for m in parley.store.path(conv)][:-1] + [first]
    assert last_turn(parley, conv)["continue_final"]
    # The engine refuses the next continuation: the answer keeps its text and state, the error is shown.
    engine = parley.bridge.engine
    monkeypatch.setattr(engine, "submit", lambda *args, **kwargs: 10**9)
    assert service.continue_answer(conv, answer.id)
    service._on_failed(service.live(conv).session_id, 10**9, "no room")
    after = last(parley, conv)
    assert after.content == grown.content and after.state == "done" and after.error == "no room"
    assert not service.busy(conv)
