"""The compare view as a user comparing models sees it: which column is which, and each column's figures, at any width."""
from __future__ import annotations

import shutil

import pytest

from tests.app.helpers import hold_engine, wait_idle

LONG_NAME = "Meta-Llama-3.1-8B-Instruct-abliterated-Q4_K_M"  # as real files are named


@pytest.fixture
def long_named(parley, qtbot, tiny_models, tmp_path) -> str:
    """The tiny Llama imported from a file with a real model's long name; its key."""
    path = tmp_path / f"{LONG_NAME}.gguf"
    shutil.copyfile(tiny_models["llama"].gguf_path, path)
    key = parley.models.import_path(path)
    qtbot.waitUntil(lambda: parley.models.registry.get(key) is not None, timeout=60_000)
    return key


def _two_columns(parley, key: str, width: int = 800):
    """Two columns of one long-named model, greedy and drawn at T 0.8, in a window `width` px wide."""
    w = parley.window
    w.resize(width, 700)
    w.show_compare()
    view = w.compare
    view.set_columns(2)
    for column, temperature in zip(view.columns, (0.0, 0.8)):
        settings = parley.store.get(column.conv_id).settings
        parley.service.set_settings(column.conv_id, settings.copy(model=key, temperature=temperature, max_tokens=6))
        column.picker.reload(key)
    return view


def _shown_whole(label) -> bool:
    return label.fontMetrics().horizontalAdvance(label.text()) <= label.width()


def test_a_narrow_column_keeps_the_settings_that_tell_it_apart(parley, qtbot, long_named):
    """At 800 px both labels read "A: Meta-Llama-3.1-8B-Inst…" and "B: Meta-Llama-3.1-8B-Inst…": the T 0.8 that
    was the whole point of the comparison was cut off; the name gives way now (the picker under it shows it)."""
    view = _two_columns(parley, long_named)
    qtbot.waitUntil(lambda: view.layout_mode == "row" and view.columns[1].label.width() < 300)
    a, b = (c.label.text() for c in view.columns)
    assert a.startswith("A: ") and a.endswith(" · T 0") and "…" in a, a
    assert b.startswith("B: ") and b.endswith(" · T 0.8"), b
    assert view.columns[1].label.full_text() == f"B: {LONG_NAME} · T 0.8"  # and whole in its tooltip


def test_each_columns_figures_stay_on_one_line_that_holds_still(parley, qtbot, long_named):
    """A column's speed line wrapped: a long name's line took three lines in a 256 px column, a third column's was
    cut to half lines at 1400 px, and the answer above jumped as the figures and the Stop button came and went. It
    is one line now, the name giving way before the tok/s and TTFT."""
    view = _two_columns(parley, long_named)
    qtbot.waitUntil(lambda: view.layout_mode == "row" and view.columns[1].stats.width() < 300)
    idle = [c.view.height() for c in view.columns]
    hold_engine(parley, 0.3)
    assert view.send("hello")
    assert all(c.stop_button.isVisibleTo(view) for c in view.columns)
    qtbot.wait(10)  # a layout pass with the Stop buttons and "streaming" shown
    assert [c.view.height() for c in view.columns] == idle
    wait_idle(parley, qtbot, *(c.conv_id for c in view.columns))
    qtbot.wait(10)
    assert [c.view.height() for c in view.columns] == idle
    for column in view.columns:
        shown = column.stats.text()
        assert _shown_whole(column.stats) and "tok/s" in shown and "TTFT" in shown, shown
        assert column.stats.full_text().startswith(LONG_NAME)  # in the tooltip


def test_a_waiting_columns_seconds_count_up_as_the_chats_do(parley, qtbot):
    """A column waiting for the engine (or reading a long prompt) read "queued · 0 s" until its first token, however
    long that took; the chat's line counted, but its 1 s timer fired at 0.99 s and read "0 s" for two seconds."""
    w = parley.window
    hold_engine(parley, 1.8)  # the turns are submitted and wait for the engine thread
    assert w.chat.send("hello")
    w.show_compare()
    column = w.compare.columns[0]
    assert w.compare.send("hello")
    lines = (column.stats.full_text, w.chat.status.text.full_text)
    assert all("queued · 0 s" in line() for line in lines)
    qtbot.waitUntil(lambda: all("queued · 1 s" in line() for line in lines), timeout=1500)
    w.compare.stop()
    w.chat.stop()
    wait_idle(parley, qtbot, w.chat.conv_id, *(c.conv_id for c in w.compare.columns))
    assert not column._ticker.isActive() and not w.chat.status._ticker.isActive()


def _body_top(column, msg) -> float:
    """Where the answer's text starts in its document: below the header of name, seed and links."""
    doc, _ = column.view.delegate.document(msg)
    return doc.documentLayout().blockBoundingRect(doc.find(msg.content.split()[0]).block()).top()


def test_a_narrow_columns_answer_puts_its_links_under_the_name(parley, qtbot, long_named):
    """In a 200 px column the name and seed beside Continue · Copy · Regenerate each wrapped: 6 lines (88 px) before
    the answer's first word at 800 px. The links take a row of their own under the name: the name's lines and one."""
    from PySide6.QtGui import QTextDocument

    view = _two_columns(parley, long_named)
    assert view.send("hello")
    wait_idle(parley, qtbot, *(c.conv_id for c in view.columns))
    column = view.columns[1]
    msg = parley.store.path(column.conv_id)[-1]
    name = QTextDocument()  # the name and seed alone at the column's width
    name.setDocumentMargin(0)
    name.setDefaultFont(column.view.font())
    name.setHtml(f"<b>{LONG_NAME}</b> · seed {msg.stats['seed']}")
    name.setTextWidth(column.view.delegate.text_width())
    line = column.view.fontMetrics().height()
    assert _body_top(column, msg) <= name.size().height() + 1.5 * line
    parley.window.resize(1400, 700)  # wide: the links beside the name again
    qtbot.waitUntil(lambda: column.view.delegate.text_width() > 400)
    assert _body_top(column, msg) <= name.size().height()


def test_any_column_closes_and_the_others_keep_their_models_and_answers(parley, qtbot, imported_llama):
    """Only the column count took a column away, and always the last: to drop B of A, B, C the user lost C's model
    and settings. Each column's Close takes that one; its answers become a chat, the others move up a letter."""
    view = parley.window.compare
    parley.window.show_compare()
    view.set_columns(3)
    view.columns[2].set_model(imported_llama)
    for column in view.columns:
        settings = parley.store.get(column.conv_id).settings
        parley.service.set_settings(column.conv_id, settings.copy(temperature=0.0, max_tokens=4))
    assert view.send("hello")
    wait_idle(parley, qtbot, *(c.conv_id for c in view.columns))
    a, b, c = view.columns
    keep = [a.conv_id, c.conv_id]
    assert b.close_button.accessibleName() == "Close column B" and b.close_button.isVisibleTo(view)
    b.close_button.click()
    assert [col.conv_id for col in view.columns] == keep and view.count.value() == 2
    assert view.columns[1].letter == "B" and view.columns[1].label.full_text().startswith("B: llama")
    assert parley.service.store.compare_groups()[view.group_id] == keep  # what a restart opens
    assert b.conv_id in parley.window.sidebar.ids() and "Column B had answers" in view.queued.text()
    qtbot.waitUntil(lambda: view.grid.indexOf(b) == -1 and view.columns[1].geometry().left() > 0)
    assert not any(col.close_button.isVisibleTo(view) for col in view.columns)  # two at the least


def test_an_answer_says_loading_the_model_only_while_it_loads(parley, qtbot):
    """Every turn's answers read 'Loading the model…' until the engine took the turn, the model loaded all along: a
    flash of 50-200 ms in each of 4 columns on Gemma 3 270M. It is said while the model loads, not after."""
    w = parley.window
    w.show_compare()
    view = w.compare
    for column in view.columns:
        settings = parley.store.get(column.conv_id).settings
        parley.service.set_settings(column.conv_id, settings.copy(temperature=0.0, max_tokens=4))
    texts = lambda: [c.view.delegate.document(parley.store.path(c.conv_id)[-1])[0].toPlainText() for c in view.columns]
    hold_engine(parley, 0.3)  # the turns are submitted and wait for the engine thread
    assert view.send("hello")
    assert all("Loading the model" not in t and "▍" in t for t in texts()), texts()
    wait_idle(parley, qtbot, *(c.conv_id for c in view.columns))
    assert parley.models.unload("default")
    assert view.send("again")
    assert all("Loading the model" in t for t in texts()), texts()  # loading it again
    wait_idle(parley, qtbot, *(c.conv_id for c in view.columns))


def test_an_exported_comparison_keeps_each_answers_figures(parley, qtbot):
    """The export had each column's answer but not its speed or wait: the figures a comparison of models is for."""
    view = parley.window.compare
    parley.window.show_compare()
    for column in view.columns:
        settings = parley.store.get(column.conv_id).settings
        parley.service.set_settings(column.conv_id, settings.copy(temperature=0.0, max_tokens=4))
    assert view.send("hello")
    wait_idle(parley, qtbot, *(c.conv_id for c in view.columns))
    text = view.export_markdown()
    for column in view.columns:
        stats = parley.store.path(column.conv_id)[-1].stats
        figures = (f"_{stats['completion_tokens']} tokens · {stats['tokens_per_s']:.1f} tok/s · "
                   f"TTFT {stats['ttft_s'] * 1000:.0f} ms_")
        assert f"### {column.label.full_text()}\n\n{figures}\n\n" in text, text


def test_the_live_panel_tells_the_columns_of_a_comparison_apart(parley, qtbot):
    """Every column of a comparison read 'Compare column: hello' in the Live panel: two columns of one model at two
    temperatures were two identical rows. Each row starts with its column's letter, as the compare view's labels do."""
    w = parley.window
    w.show_compare()
    view = w.compare
    hold_engine(parley, 0.3)  # the columns are live while the panel is read
    assert view.send("hello")
    rows = sorted(title for _conv, title, *_ in w.live_panel.rows())
    assert rows == ["A · Compare: hello", "B · Compare: hello"]
    view.stop()
    wait_idle(parley, qtbot, *(c.conv_id for c in view.columns))
