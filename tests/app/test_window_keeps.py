"""What the window lost or said wrong (sweep AQ): an edit in progress left behind by another chat, a refused message's
hidden rows, a transient failure handed back as if refused, an unloaded model shown as if loaded."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from tests.app.helpers import last, start_app, wait_idle


def _active(qtbot, window) -> None:
    """Shortcuts reach only an active window (offscreen too)."""
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)


def _say(parley, qtbot, conv: int, text: str) -> None:
    edit = parley.window.chat.composer.edit
    edit.setFocus()
    QTest.keyClicks(edit, text)
    QTest.keyClick(edit, Qt.Key.Key_Return)
    wait_idle(parley, qtbot, conv)


def _switch(window, step: int) -> None:
    """Ctrl+Tab (or Ctrl+Shift+Tab) from the box, as a user goes to the next (previous) chat."""
    mods = Qt.KeyboardModifier.ControlModifier | (Qt.KeyboardModifier.ShiftModifier if step < 0 else 0)
    QTest.keyClick(window.focusWidget(), Qt.Key.Key_Tab, mods)


# -- 1: an edit in progress
def test_an_edit_in_progress_stays_with_its_chat_and_its_text_survives_a_restart(qtbot, qapp, tiny_models, tmp_path):
    """Another chat opened mid-edit cancelled the edit: the text typed into it was gone on return (and at a restart)."""
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    w, service = app.window, app.service
    _active(qtbot, w)
    first = w.current()
    service.set_settings(first, app.store.get(first).settings.copy(max_tokens=4))
    _say(app, qtbot, first, "hi")
    w.chat.composer.edit.setPlainText("a draft of my own")
    user = app.store.path(first)[0]
    w.chat.view.activate(user, "edit:")  # the message's Edit link
    QTest.keyClicks(w.chat.composer.edit, " and what I added")
    other = w.new_chat()
    assert w.current() == other and w.chat.editing is None and w.chat.composer.edit.toPlainText() == ""
    _switch(w, -1)  # back, by the keyboard
    assert w.current() == first and w.chat.editing == user.id and w.chat.composer.banner.isVisible()
    assert w.chat.composer.edit.toPlainText() == "hi and what I added"
    assert service.draft(first) == "a draft of my own"  # the chat's own draft waits under the edit, as before
    app.close()
    again = start_app(qtbot, tmp_path / "data", tiny_models)
    try:  # the edit comes back as the edit (tests/app/test_window_loose_ends.py), the draft under it
        assert again.service.open_edit(first) == (user.id, "hi and what I added")
        assert again.service.draft(first) == "a draft of my own"
    finally:
        again.close()


def test_an_edit_given_up_with_esc_is_not_kept(parley, qtbot):
    w, conv = parley.window, parley.window.current()
    parley.service.set_settings(conv, parley.store.get(conv).settings.copy(max_tokens=4))
    _say(parley, qtbot, conv, "hi")
    w.chat.view.activate(parley.store.path(conv)[0], "edit:")
    assert parley.service.drafts() == {}  # opened, not changed: a restart has nothing to give back
    QTest.keyClicks(w.chat.composer.edit, " more")
    QTest.keyClick(w.chat.composer.edit, Qt.Key.Key_Escape)
    w.open_chat(w.new_chat())
    w.open_chat(conv)
    assert w.chat.editing is None and w.chat.composer.edit.toPlainText() == "" and parley.service.drafts() == {}


# -- 2: a refused message leaves nothing behind
LONG = " ".join(f"word{i} is here." for i in range(600))  # far over the tiny engine's 512 tokens


def test_a_refused_message_leaves_no_row_and_a_restart_shows_the_same(qtbot, qapp, tiny_models, tmp_path):
    """It was kept as two hidden rows per refusal (emptied, marked failed): the SQLite store deleted no message."""
    import sqlite3

    app = start_app(qtbot, tmp_path / "data", tiny_models)
    w, conv = app.window, app.window.current()
    w.chat.composer.edit.setPlainText(LONG)  # as a paste
    QTest.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    wait_idle(app, qtbot, conv)
    assert w.chat.refused_note.isVisible() and w.chat.composer.edit.toPlainText() == LONG
    app.store.flush()
    db = sqlite3.connect(app.store.file)
    try:
        assert db.execute("SELECT count(*) FROM message").fetchone()[0] == 0
    finally:
        db.close()
    assert app.store.children(conv, None) == [] and app.store._messages == {}
    app.close()
    again = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        assert again.store.path(conv) == [] and again.store._messages == {} and again.service.draft(conv) == LONG
    finally:
        again.close()


# -- 3: which failures give the message back
def _failed_turn(parley, qtbot, conv: int) -> tuple:
    """(user message, its failed answer): a turn sent on the session the engine closed as it let the model go."""
    models = parley.models
    parley.service.set_settings(conv, parley.store.get(conv).settings.copy(max_tokens=4))
    _say(parley, qtbot, conv, "hi")
    parley.bridge.engine.unload_model(models.model_id("default"))  # let go by a caller of the engine's own
    _say(parley, qtbot, conv, "hello again")  # sent before the app hears of it
    qtbot.waitUntil(lambda: models.model_id("default") is None)  # the app has heard of the unload by now
    return tuple(parley.store.path(conv)[-2:])


def test_a_failure_other_than_an_overflow_keeps_the_message_with_a_working_retry(parley, qtbot):
    """Every failure before the first token gave the message back as refused ('Not sent: Chat session 2 does not
    exist…'), though sending it again was all it needed: the bridge dropped the engine's code."""
    from app.core.message_html import message_actions

    w, conv, models = parley.window, parley.window.current(), parley.models
    user, failed = _failed_turn(parley, qtbot, conv)
    assert (user.content, failed.state, failed.content) == ("hello again", "error", "")
    assert not w.chat.refused_note.isVisible() and w.chat.composer.edit.toPlainText() == ""
    assert ("Retry", "regen:") in message_actions(failed, 1, 1, busy=False)
    assert failed.error == "The model was unloaded before it answered. Retry loads it again."  # not the session's id
    w.chat.view.activate(failed, "regen:")
    wait_idle(parley, qtbot, conv)
    answer = last(parley, conv)
    assert answer.state == "done" and answer.content and models.model_id("default") is not None  # loaded again
    assert parley.store.versions(answer) == [answer]  # the failed try replaced, not kept as version 1 of 2


def test_the_bridge_forwards_the_engine_s_error_code(qtbot):
    from app.qt.bridge import EngineBridge
    from engine import events as ev
    from engine.runtime import EngineConfig

    bridge = EngineBridge(EngineConfig())  # not started: events are handed to it as the engine thread would
    with qtbot.waitSignal(bridge.turn_failed) as failed:
        bridge._on_engine_event(ev.Error(3, 7, "The message needs 900 tokens", "context_length_exceeded"))
    assert failed.args == [3, 7, "The message needs 900 tokens", "context_length_exceeded"]
    bridge.shutdown()


def test_retry_on_a_failed_answer_the_chat_went_on_from_keeps_what_follows(parley, qtbot):
    """Retry replaces a failed answer with nothing under it; one followed by more of the chat is kept as a version."""
    conv = parley.window.current()
    user, failed = _failed_turn(parley, qtbot, conv)
    _say(parley, qtbot, conv, "anyone there?")  # goes on under the failed answer (and loads the model again)
    later = parley.store.path(conv)[-2]
    parley.window.chat.view.activate(failed, "regen:")
    wait_idle(parley, qtbot, conv)
    assert parley.store.has_message(failed.id) and parley.store.has_message(later.id)
    assert len(parley.store.versions(last(parley, conv))) == 2 and last(parley, conv).parent_id == user.id


# -- 4: the status line after an unload
def test_the_status_line_says_the_model_is_not_loaded_and_loads_at_the_next_message(parley, qtbot):
    """After an unload it read 'qwen3 · 401.3 tok/s · TTFT 4 ms' as if the model were still there."""
    w, conv, models = parley.window, parley.window.current(), parley.models
    parley.service.set_settings(conv, parley.store.get(conv).settings.copy(max_tokens=4))
    _say(parley, qtbot, conv, "hi")
    line = w.chat.status.text
    assert "not loaded" not in line.text()
    parley.bridge.engine.unload_model(models.model_id("default"))
    qtbot.waitUntil(lambda: "not loaded" in line.text())
    assert "loads when you send" in line.text() and "tok/s" in line.text()  # the last answer's figures stay
    _say(parley, qtbot, conv, "and again")
    assert "not loaded" not in line.text() and models.model_id("default") is not None


# -- 5: what a thought cut short says
def test_a_thought_cut_short_by_a_full_context_names_only_what_is_offered(parley):
    """It said 'Continue, or raise Max tokens…' where Continue is not offered and more tokens cannot fit."""
    from app.core.message_html import message_actions

    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "prove it")
    answers = {}
    for reason in ("length", "context_full"):
        answers[reason] = store.add_message(conv, user.id, "assistant", "<think>\nFirst, two and two.")
        store.update_message(answers[reason].id, stats={"reason": reason})
    w.open_chat(conv)
    for reason, answer in answers.items():
        text = " ".join(w.chat.view.delegate.document(answer)[0].toPlainText().split())
        offered = [label for label, _href in message_actions(answer, 1, 2, busy=False)]
        assert ("Continue" in offered) == ("Continue" in text) == (reason == "length"), (reason, text)
    assert "Turn Thinking off in the chat settings and Regenerate, or start a new chat" in text
    assert "Max tokens" not in text and "Regenerate" in offered


# -- a model unloaded mid-answer (sweep AS)
def test_an_answer_cut_by_its_model_s_unload_says_so_and_a_stop_does_not(parley, qtbot):
    """Unloading the model a chat answered with ended the answer as 'Stopped', as if the user had pressed Stop."""
    from app.core.chats import UNLOADED_MID_ANSWER
    from app.core.message_html import _note

    s, conv, models = parley.service, parley.window.current(), parley.models
    for act in ("stop", "unload"):
        s.set_settings(conv, parley.store.get(conv).settings.copy(temperature=0.0, max_tokens=400))  # no early end
        assert s.send(conv, "tell me everything")
        qtbot.waitUntil(lambda: s._live[conv].turn is not None and s._live[conv].turn.tokens > 2, timeout=60_000)
        s.stop(conv) if act == "stop" else models.unload("default")
        wait_idle(parley, qtbot, conv)
        answer = last(parley, conv)
        assert answer.state == "stopped" and answer.content, answer
        assert answer.error == ("" if act == "stop" else UNLOADED_MID_ANSWER)
    assert "unloaded while it answered" in _note(answer, dark=False)
