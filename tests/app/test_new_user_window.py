"""Three things a new user met in the window (sweep AL, fixed by AM): a message too long for the context, empty New
chats piling up, and a Live panel that squeezed the chat's title to nothing."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from tests.app.helpers import handed, start_app, wait_idle

LONG = " ".join(f"word{i} is here." for i in range(600))  # far over the tiny engine's 512 tokens


def _active(qtbot, window) -> None:
    """Shortcuts reach only an active window (offscreen too)."""
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)


def _enter(edit, text: str) -> None:
    edit.setFocus()
    edit.setPlainText(text)  # as a paste: typing 10,000 characters one key at a time is not the point
    QTest.keyClick(edit, Qt.Key.Key_Return)


# -- 1: a message over the context
def test_a_message_over_the_context_comes_back_to_the_box_with_why(parley, qtbot):
    """The box emptied, the refused text stayed only in the chat, under an error with a Regenerate that failed the
    same way; the next message went after it, a half-turn the engine read again."""
    w, conv = parley.window, parley.window.current()
    edit, note = w.chat.composer.edit, w.chat.refused_note
    _enter(edit, LONG)
    wait_idle(parley, qtbot, conv)
    assert edit.toPlainText() == LONG  # back to be shortened, nothing lost
    assert note.isVisible() and "Not sent" in note.text() and "the context holds 512" in note.text()
    assert parley.store.path(conv) == [] and parley.store.get(conv).title == "New chat"  # no stuck half-turn
    assert w.chat.body.currentWidget() is w.chat.empty
    _enter(edit, "hello")
    wait_idle(parley, qtbot, conv)
    assert handed(parley, conv) == ["hello"]  # alone: the refused message is no part of the conversation
    path = parley.store.path(conv)
    assert [(m.role, m.state) for m in path] == [("user", "done"), ("assistant", "done")]
    assert parley.store.versions(path[0]) == [path[0]] and not note.isVisible() and edit.toPlainText() == ""


def test_a_refused_edit_opens_again_as_the_edit(parley, qtbot):
    """An earlier message edited to something too long: the old branch stays shown, the text back in that edit."""
    w, conv = parley.window, parley.window.current()
    parley.service.set_settings(conv, parley.store.get(conv).settings.copy(max_tokens=4))
    _enter(w.chat.composer.edit, "hi")
    wait_idle(parley, qtbot, conv)
    before = [m.id for m in parley.store.path(conv)]
    w.chat.begin_edit(before[0])
    _enter(w.chat.composer.edit, LONG)
    wait_idle(parley, qtbot, conv)
    assert [m.id for m in parley.store.path(conv)] == before
    assert parley.store.versions(parley.store.message(before[0])) == [parley.store.message(before[0])]
    assert w.chat.editing == before[0] and w.chat.composer.banner.isVisible()
    assert w.chat.composer.edit.toPlainText() == LONG and "The edit is back" in w.chat.refused_note.text()
    assert parley.service.draft(conv) == ""  # the text is the edit's, not sent as a new message by Enter
    other = w.new_chat()  # another chat and back: the edit opens again as the box left it
    w.open_chat(conv)
    assert w.chat.editing == before[0] and w.chat.composer.edit.toPlainText() == LONG and w.current() != other
    QTest.keyClick(w.chat.composer.edit, Qt.Key.Key_Escape)  # given up: the note goes with it
    assert w.chat.editing is None and not w.chat.refused_note.isVisible()


def test_a_refused_message_is_on_no_branch():
    """Deleted with its answer (it was kept emptied, as two hidden rows): no version of another, never followed."""
    from app.core.conversations import ConversationStore
    from app.core.export import export_markdown

    store = ConversationStore()
    conv = store.create().id
    user = store.add_message(conv, None, "user", "hi")
    answer = store.add_message(conv, user.id, "assistant", "hello")
    refused = store.add_message(conv, answer.id, "user", "too long")
    store.add_message(conv, refused.id, "assistant", state="error")
    store.delete_message(refused.id)
    store.select(user.id)  # as a version switch does: down the newest children
    assert store.path(conv) == [user, answer]
    other = store.add_message(conv, answer.id, "user", "again")
    assert store.versions(other) == [other] and store.children(conv, answer.id) == [other]
    assert "version" not in export_markdown(store, [conv])  # "(version 2 of 2)" beside a message never shown


# -- 2: empty New chats
def test_new_chat_on_an_untouched_chat_makes_no_other_and_a_restart_keeps_none(qtbot, qapp, tiny_models, tmp_path):
    """Ctrl+N three times made three more empty chats, all kept after a restart. A chat with a draft, settings or a
    message of the user's is kept."""
    first = start_app(qtbot, tmp_path / "data", tiny_models)
    w, service = first.window, first.service
    _active(qtbot, w)

    def ctrl_n() -> int:
        QTest.keyClick(w.focusWidget(), Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        return w.current()

    start = w.current()
    assert [ctrl_n() for _ in range(3)] == [start] * 3 and w.sidebar.ids() == [start]
    w.show_compare()  # its columns are chats too, hidden: untouched or not, they stay
    columns = [c.conv_id for c in w.compare.columns]
    assert ctrl_n() == start and w.stack.currentWidget() is w.chat and all(map(first.store.has, columns))
    first.store.add_message(start, None, "user", "hi")  # a chat with a message
    drafted = ctrl_n()
    QTest.keyClicks(w.chat.composer.edit, "a draft")
    configured = ctrl_n()
    assert len({start, drafted, configured}) == 3
    service.set_settings(configured, first.store.get(configured).settings.copy(temperature=0.1))
    empty = ctrl_n()
    assert ctrl_n() == empty and len(w.sidebar.ids()) == 4
    w.open_chat(start)
    w.sidebar.new_button.click()  # the button as Ctrl+N
    assert not first.store.has(empty) and len(w.sidebar.ids()) == 4  # the one left as made went
    left = w.current()
    w.open_chat(start)
    first.close()
    second = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        assert set(second.window.sidebar.ids()) == {start, drafted, configured}  # `left`, untouched, not kept
        assert left not in second.window.sidebar.ids() and second.service.draft(drafted) == "a draft"
    finally:
        second.close()


# -- 3: the Live panel beside a chat in a small window
def test_the_live_panel_gives_way_to_the_chat_title_in_a_small_window(parley, qtbot):
    """At 800 px the open Live panel left the title 0 px: it read nothing. The title keeps a readable width (elided,
    the whole of it in its tooltip), the panel narrows first and takes its width back in a wide window."""
    w = parley.window
    w.resize(1200, 780)  # from a wide window (a first one fits the 800 px offscreen screen)
    title = "Why is the sky blue? A long question about light"
    parley.service.rename(w.current(), title)
    w.live_panel.show()
    label, sidebar = w.chat.title, w.sidebar.width()
    w.resize(800, 700)
    natural = w.live_panel.sizeHint().width()
    qtbot.waitUntil(lambda: w.width() == 800 and w.live_panel.width() < natural)  # the panel gives way
    assert label.width() >= label.fontMetrics().horizontalAdvance("Why is the")
    assert label.text().startswith("Why is the") and label.text().endswith("…") and label.toolTip() == title
    assert w.sidebar.width() == sidebar  # the panel gave way, not the sidebar
    assert w.minimumSizeHint().width() <= 800
    w.resize(1440, 800)
    qtbot.waitUntil(lambda: w.live_panel.width() == natural)
    assert label.text() == title
