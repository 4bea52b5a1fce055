"""A month of daily use: long chats over the context, scrolling back through a long chat, regenerating with a fixed
seed, a comparison closed mid-scroll."""
from __future__ import annotations

from PySide6.QtCore import Qt

from tests.app.helpers import configure, wait_idle

HISTORY = "the earlier steps are all done and checked " * 2  # ~90 tokens of the tiny models: a dozen overflow 512


def _chat_with_history(parley, pairs: int) -> int:
    """A chat whose earlier turns (written through the store, as a restart reads them) overflow the tiny context."""
    conv = parley.window.new_chat()
    parent = None
    for i in range(pairs):
        user = parley.store.add_message(conv, parent, "user", f"question {i}: {HISTORY}")
        parent = parley.store.add_message(conv, user.id, "assistant", f"answer {i}: {HISTORY}").id
    parley.window.open_chat(conv)
    return conv


def test_an_answer_written_without_the_oldest_messages_says_so_and_keeps_saying_it(parley, qtbot):
    """The overflow policy left the oldest messages out and only the meter's tooltip said so while the answer
    streamed; once it ended nothing did (the meter read a near-empty context under an answer that saw none of it)."""
    conv = _chat_with_history(parley, pairs=6)
    configure(parley, conv, temperature=0.0, max_tokens=4)
    told = []  # what the engine said it left out of the turn
    parley.bridge.context_usage.connect(lambda _sid, _used, _limit, dropped: told.append(dropped))
    parley.window.chat.send("and now?")
    wait_idle(parley, qtbot, conv)
    answer = parley.store.path(conv)[-1]
    left_out = told[-1]
    assert 0 < left_out < 12  # the history does overflow, as the test means
    assert answer.stats["dropped_messages"] == left_out
    shown = parley.window.chat.view.delegate.document(answer)[0].toPlainText()
    assert f"Written without the chat's {left_out} oldest messages: they do not fit its context of 512 tokens" in shown
    model = parley.window.chat.view.model()
    said = model.index(model.rowCount() - 1, 0).data(Qt.ItemDataRole.AccessibleTextRole)
    assert f"written without the chat's {left_out} oldest messages" in said  # a screen reader reads it too
    assert parley.service.status(conv).dropped_messages == left_out  # after the turn, from the answer's stats
    assert f"{left_out} oldest messages left out" in parley.window.chat.status.meter.toolTip()


def test_an_answer_that_saw_the_whole_chat_has_no_such_note(parley, qtbot):
    conv = _chat_with_history(parley, pairs=0)
    configure(parley, conv, temperature=0.0, max_tokens=4)
    parley.window.chat.send("hello")
    wait_idle(parley, qtbot, conv)
    answer = parley.store.path(conv)[-1]
    assert "dropped_messages" not in answer.stats
    assert "Written without" not in parley.window.chat.view.delegate.document(answer)[0].toPlainText()


def _code_answer(i: int) -> str:
    code = "\n".join(f"    total_{j} = compute(values[{j}], scale={j}.5)  # step {j}" for j in range(40))
    table = "\n".join(f"| item {j} | {j * 17} ms |" for j in range(8))
    return f"Case {i}:\n\n```python\ndef run_{i}(values):\n{code}\n```\n\n| name | time |\n|---|---|\n{table}\n"


def _code_chat(parley, turns: int = 30) -> tuple[int, list]:
    """A chat of `turns` questions and code-heavy answers, open in the window; its messages."""
    conv = parley.window.new_chat()
    parent = None
    for i in range(turns):
        user = parley.store.add_message(conv, parent, "user", f"Turn {i}: change step {i}.")
        parent = parley.store.add_message(conv, user.id, "assistant", _code_answer(i)).id
    parley.window.open_chat(conv)
    return conv, parley.store.path(conv)


def _drawn(view, qapp, turns: int = 5) -> None:
    """Paints and the turns of the event loop after them: the heights found at a paint, then their layout."""
    for _turn in range(turns):
        view.viewport().repaint()
        qapp.processEvents()


def test_scrolling_up_a_long_chat_moves_the_text_by_the_step_only(parley, qtbot, qapp):
    """Messages above the screen are laid out at an estimated height until drawn; a code-heavy answer's estimate was
    off by hundreds of pixels (1,114-2,674 px in a 300-turn chat of the month's store), and the text being read jumped
    by that much as each one scrolled into view. The message on screen now stays where the step put it."""
    _code_chat(parley)
    view = parley.window.chat.view
    _drawn(view, qapp)  # laid out, the answers at the bottom drawn at their real heights
    bar, moves = view.verticalScrollBar(), []
    for _ in range(60):  # ~4,300 px up: through several answers drawn for the first time
        index = view.indexAt(view.viewport().rect().center())
        before = view.visualRect(index).top()
        bar.setValue(bar.value() - 72)  # a wheel step
        _drawn(view, qapp, turns=1)
        qapp.processEvents()
        moves.append(view.visualRect(index).top() - before)
    assert view.delegate.renders > 6  # answers were drawn for the first time on the way
    assert moves == [72] * len(moves)


def test_a_layout_of_a_long_chat_measures_no_text_it_measured_before(parley, qapp, monkeypatch):
    """Every message drawn anew at a height other than its estimate lays the whole chat out again, and each layout
    split and measured every message's text again: 15-24 ms of a 600-message chat's layout here, now ~4 ms."""
    from app.qt import chat_view

    conv = parley.window.new_chat()
    parent = None
    for i in range(100):
        parent = parley.store.add_message(conv, parent, "user" if i % 2 == 0 else "assistant", _code_answer(i)).id
    view = parley.window.chat.view
    parley.window.open_chat(conv)
    view.doItemsLayout()
    measured = []
    real = chat_view._estimate
    monkeypatch.setattr(chat_view, "_estimate", lambda text, width: measured.append(text) or real(text, width))
    view.doItemsLayout()
    assert measured == []
    parley.store.append_text(parent, " and more")  # a message's text that changed is measured again
    view.doItemsLayout()
    assert len(measured) <= 1


def test_a_greedy_regeneration_names_no_seed(parley, qtbot):
    """A fixed seed advances for a sampled chat's Regenerate; a greedy answer draws nothing and names none."""
    conv = parley.window.current()
    configure(parley, conv, temperature=0.0, seed=7, max_tokens=4)
    parley.window.chat.send("hello")
    wait_idle(parley, qtbot, conv)
    parley.service.regenerate(conv)
    wait_idle(parley, qtbot, conv)
    assert [a.stats.get("seed") for a in parley.store.versions(parley.store.path(conv)[-1])] == [None, None]


def test_a_compare_view_gone_before_its_scroll_sync_settles_is_not_called(parley, qtbot):
    """A column scrolled asks to be aligned again 60 ms later; a view deleted meanwhile (a closed window) was still
    called, and its QAction's 'already deleted' error failed the next test's setup."""
    from PySide6.QtCore import QCoreApplication, QEvent

    from app.qt.compare import SYNC_SETTLE_MS, CompareView

    view = CompareView(parley.service, parley.models)
    view.ensure_columns()
    view._sync_from(view.columns[0])  # as a scroll bar's step does
    view.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    qtbot.wait(3 * SYNC_SETTLE_MS)  # past the moment it was due: pytest-qt fails the test on an error raised in it


def test_switching_a_version_in_the_middle_of_a_long_chat_keeps_the_place(parley, qtbot, qapp):
    """A version switched resets the view's rows; the place the user read at stays where it was (laid out as a
    fresh chat would be, it went to the bottom)."""
    conv, path = _code_chat(parley)
    question, first = path[30], path[31]
    second = parley.store.add_message(conv, question.id, "assistant", _code_answer(99))  # a regenerated version
    parley.store.select(first.id)  # its first version shown, the turns after it below
    parley.window.open_chat(conv)
    view = parley.window.chat.view
    row = view.chat_model.row_of(question.id)
    view.scrollTo(view.model().index(row, 0))
    _drawn(view, qapp)
    before = view.visualRect(view.model().index(row, 0)).top()
    parley.service.switch_version(first.id, 1)  # to the second version: the turns after the first are no longer shown
    _drawn(view, qapp)
    assert parley.store.path(conv)[-1].id == second.id
    assert view.visualRect(view.model().index(view.chat_model.row_of(question.id), 0)).top() == before


def test_a_turn_added_below_while_scrolled_up_keeps_the_place(parley, qtbot, qapp):
    """Rows added (a queued message sent by itself while the user reads far up) drop the rows' places until the next
    layout; the place read at stays (found after them, the anchor took the view to the bottom)."""
    conv, path = _code_chat(parley)
    view = parley.window.chat.view
    view.scrollTo(view.model().index(20, 0))
    _drawn(view, qapp)
    before = view.visualRect(view.model().index(20, 0)).top()
    user = parley.store.add_message(conv, path[-1].id, "user", "sent by itself")
    parley.store.add_message(conv, user.id, "assistant", _code_answer(100))
    parley.service.path_changed.emit(conv)
    _drawn(view, qapp)
    assert view.model().rowCount() == 62
    assert view.visualRect(view.model().index(20, 0)).top() == before
