"""Compare view: one prompt to several columns, each with its own model and history; one-at-a-time; promote."""
from __future__ import annotations

from tests.app.helpers import handed, wait_idle


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
    assert [a.model for a in answers] == ["qwen3", "llama"]
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
