"""Held-out cases of the compare view and model management: long and CJK diffs, imports and removals while loading."""
from __future__ import annotations

import random
import re
import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.core.comparison import similarity, word_diff_html
from app.qt.compare_column import COLUMN_MIN_WIDTH
from tests.app.helpers import hold_engine

STRUCK = re.compile(r"<s>(.*?)</s>")
ADDED = re.compile(r'color:#055d20">(.*?)</span>')


def _long_answer(words: int, seed: int) -> list[str]:
    """Text-like words: a few frequent ones ("the", "of") and a long tail, as an answer has."""
    rng = random.Random(seed)
    common = "the of and a to in is it that on for as with was".split()
    rare = [f"word{i}" for i in range(2000)]
    return rng.choices(common + rare, [40] * len(common) + [1] * len(rare), k=words)


def test_the_diff_of_two_long_answers_takes_no_time():
    a = _long_answer(3000, seed=1)
    b = list(a)
    b[1000], b[2000] = "changed", "different"
    old, new = " ".join(a), " ".join(b)
    start = time.perf_counter()
    text, agree = word_diff_html(old, new), similarity(old, new)
    assert time.perf_counter() - start < 2.0  # it took 10 s and more, the window frozen meanwhile
    assert STRUCK.findall(text) == [a[1000], a[2000]] and ADDED.findall(text) == ["changed", "different"]
    assert agree > 0.99


def test_a_chinese_or_japanese_answer_is_compared_character_by_character():
    text = word_diff_html("我喜欢猫。它们很可爱。", "我喜欢狗。它们很可爱。")
    assert STRUCK.findall(text) == ["猫"] and ADDED.findall(text) == ["狗"]
    assert similarity("今日は良い天気です", "今日は悪い天気です") > 0.8  # was 0: one "word" each
    assert "cat" in STRUCK.findall(word_diff_html("the cat sat", "the dog sat"))


def _resident(app) -> int:
    return len(app.bridge.engine.inspect()["models"])


def _count_loads(app) -> list:
    loads, real = [], app.bridge.engine.load_model
    app.bridge.engine.load_model = lambda *args, **kw: loads.append(args) or real(*args, **kw)
    return loads


def test_a_model_imported_again_while_it_loads_is_loaded_once(parley, qtbot, tiny_models):
    models, loads = parley.models, _count_loads(parley)
    first = models.import_path(tiny_models["llama"].gguf_path)
    assert models.import_path(tiny_models["llama"].gguf_path) == first  # a second click before the first loaded
    qtbot.waitUntil(lambda: models.registry.get(first) is not None, timeout=60_000)
    qtbot.wait(300)
    assert len(loads) == 1 and _resident(parley) == 2  # the default and one llama


def test_the_embedded_models_own_file_imported_is_the_embedded_model(parley, qtbot, tiny_models):
    models, loads = parley.models, _count_loads(parley)
    with qtbot.waitSignal(models.imported, timeout=10_000) as imported:  # once its check is back
        models.import_path(tiny_models["qwen3"].gguf_path)  # the file the default loads from
    assert imported.args == ["default"]
    qtbot.wait(300)
    assert loads == [] and [e.key for e in models.registry.entries()] == ["default"] and _resident(parley) == 1


def test_a_model_removed_while_it_loads_is_freed_and_its_chat_does_not_hang(parley, qtbot, imported_llama):
    models, w = parley.models, parley.window
    models.unload(imported_llama)
    qtbot.waitUntil(lambda: _resident(parley) == 1, timeout=10_000)
    arrived = []
    parley.bridge.model_loaded.connect(lambda *args: arrived.append(args))
    conv = w.current()
    w.apply_settings(conv, parley.store.get(conv).settings.copy(model=imported_llama, max_tokens=4))
    assert parley.service.send(conv, "hello") and models.state(imported_llama).status == "loading"
    dialog = w.show_models()
    dialog.table.setCurrentItem(dialog.table.topLevelItem(1))
    dialog.remove_button.click()
    qtbot.waitUntil(lambda: bool(arrived), timeout=60_000)
    qtbot.waitUntil(lambda: not parley.service.busy(conv), timeout=10_000)  # it waited for a model that never came
    assert "did not load" in parley.store.path(conv)[-1].error
    qtbot.waitUntil(lambda: _resident(parley) == 1, timeout=10_000)  # the removed model does not stay in memory
    assert models.state(imported_llama) is None and parley.store.get(conv).settings.model == "default"


def test_removing_the_draft_model_stops_drafting_with_it(parley, imported_llama):
    models = parley.models
    assert models.use_as_draft(imported_llama)
    dialog = parley.window.show_models()
    dialog.table.setCurrentItem(dialog.table.topLevelItem(1))
    dialog.remove_button.click()
    assert models.registry.get(imported_llama) is None
    assert models.draft_key == "" and parley.settings.draft_model == ""  # it drafted on, named nowhere


def test_a_model_whose_file_went_away_says_so_in_the_list(parley, qtbot, tiny_models, tmp_path):
    import shutil

    copy = tmp_path / "moved later.gguf"
    shutil.copyfile(tiny_models["llama"].gguf_path, copy)
    models = parley.models
    key = models.import_path(copy)
    qtbot.waitUntil(lambda: models.registry.get(key) is not None, timeout=60_000)
    models.unload(key)
    copy.unlink()
    dialog = parley.window.show_models()
    assert dialog.rows()[1][1] == "file not found"
    dialog.table.setCurrentItem(dialog.table.topLevelItem(1))
    dialog.load_button.click()
    qtbot.waitUntil(lambda: models.state(key).status == "failed", timeout=10_000)
    row = dialog.table.topLevelItem(1)
    assert row.text(1) == "failed" and "not found" in row.toolTip(1)  # the reason, not only that it failed


def test_the_diff_opened_while_the_columns_answer_shows_their_answers_once_done(parley, qtbot):
    view, convs = _short_answers(parley)
    hold_engine(parley, 0.5)  # the answers have not begun when the dialog opens
    assert view.send("compare")
    dialog = view.show_diff()
    assert "answered" in dialog.summary.text()
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    qtbot.waitUntil(lambda: "%" in dialog.summary.text())  # stayed 'Neither column has answered yet.'
    assert dialog.text.toPlainText().split() and view.last_answer(view.columns[0]).split()[0] in dialog.text.toPlainText()
    dialog.close()


def test_the_diff_of_two_columns_without_answers_says_so(parley):
    parley.window.show_compare()
    dialog = parley.window.compare.show_diff()
    assert "%" not in dialog.summary.text() and "answered" in dialog.summary.text()
    dialog.close()


def test_a_saved_comparisons_models_load_when_it_is_shown_not_at_start(parley, qtbot, tiny_models, tmp_path,
                                                                       imported_llama):
    from tests.app.helpers import start_app

    parley.window.show_compare()
    parley.window.compare.columns[1].set_model(imported_llama)
    parley.window.open_chat(parley.window.current())  # closed on the chat page
    parley.close()
    again = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        assert again.models.state(imported_llama) is None  # a model no page on screen uses stays on disk
        again.window.show_compare()
        qtbot.waitUntil(lambda: again.models.model_id(imported_llama) is not None, timeout=60_000)
    finally:
        again.close()


def _hf_cache(tiny_models, tmp_path):
    """Tiny models laid out as huggingface_hub does: a snapshot folder (Qwen3's) whose GGUF (Llama's) links to a blob."""
    import shutil

    repo = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B"
    snapshot = repo / "snapshots" / "0f3c1e9a8b7d6c5e4f3a2b1c0d9e8f7a6b5c4d3e"
    shutil.copytree(tiny_models["qwen3"].hf_dir, snapshot)
    (repo / "blobs").mkdir()
    shutil.copyfile(tiny_models["llama"].gguf_path, repo / "blobs" / "9a1b2c3d4e5f")
    (snapshot / "qwen3-0.6b-q8_0.gguf").symlink_to(repo / "blobs" / "9a1b2c3d4e5f")
    return snapshot


def test_a_gguf_linked_from_the_hugging_face_cache_can_be_imported(parley, qtbot, tiny_models, tmp_path):
    link = _hf_cache(tiny_models, tmp_path) / "qwen3-0.6b-q8_0.gguf"
    key = parley.models.import_path(link)  # refused: the link's target has no .gguf suffix
    qtbot.waitUntil(lambda: parley.models.registry.get(key) is not None, timeout=60_000)
    assert parley.models.registry.get(key).path == str(link) and parley.models.model_id(key) is not None


def test_a_model_from_the_hugging_face_cache_is_named_by_its_repo(tiny_models, tmp_path):
    from app.core.model_registry import ModelRegistry

    snapshot = _hf_cache(tiny_models, tmp_path)
    registry = ModelRegistry()
    assert registry.candidate(snapshot).name == "Qwen/Qwen3-0.6B"  # was the commit hash
    assert registry.candidate(snapshot / "qwen3-0.6b-q8_0.gguf").name == "Qwen/Qwen3-0.6B · qwen3-0.6b-q8_0"
    assert registry.candidate(tiny_models["qwen3"].gguf_path).name == "qwen3-f32"


def _three_greedy_columns(parley, max_tokens: int):
    """The compare view shown with three columns answering greedily, up to `max_tokens`."""
    view = parley.window.compare
    parley.window.show_compare()
    view.set_columns(3)
    for column in view.columns:
        conv = parley.store.get(column.conv_id)
        parley.service.set_settings(column.conv_id, conv.settings.copy(temperature=0.0, max_tokens=max_tokens))
    return view


def test_one_column_stops_while_the_others_answer_on(parley, qtbot):
    from tests.app.helpers import wait_idle

    view = _three_greedy_columns(parley, max_tokens=60)
    assert not view.columns[1].stop_button.isVisibleTo(view)
    engine = parley.bridge.engine
    step = engine._step_hosts
    engine._step_hosts = lambda: (time.sleep(0.1), step())  # A and C outlast B's Stop (drafts: ~8 tokens a step)
    try:
        view.send("go on")
        convs = [c.conv_id for c in view.columns]
        qtbot.waitUntil(lambda: all(parley.store.path(c)[-1].content for c in convs), timeout=60_000)
        assert view.columns[1].stop_button.isVisibleTo(view)
        view.columns[1].stop_button.click()
        qtbot.waitUntil(lambda: not parley.service.busy(convs[1]), timeout=10_000)
        assert parley.service.busy(convs[0]) and parley.service.busy(convs[2])  # only column B stopped
    finally:
        engine._step_hosts = step
    wait_idle(parley, qtbot, *convs)
    assert [parley.store.path(c)[-1].state for c in convs] == ["done", "stopped", "done"]
    assert not view.columns[1].stop_button.isVisibleTo(view)


def test_a_column_taken_away_while_waiting_its_turn_is_skipped(parley, qtbot):
    view = _three_greedy_columns(parley, max_tokens=6)
    view.one_at_a_time.setChecked(True)
    convs = [c.conv_id for c in view.columns]
    assert view.send("in turns")
    view.set_columns(2)  # column C, still waiting for its turn, goes (it has nothing yet)
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)  # C's turn raised KeyError on the deleted chat
    assert [parley.store.path(c)[-1].state for c in convs[:2]] == ["done", "done"] and not parley.store.has(convs[2])


def test_a_column_made_a_chat_while_waiting_its_turn_gives_it_up(parley, qtbot):
    """"Make chat" on a column waiting its turn: the queued prompt went to the new, empty chat the column restarts with."""
    view = _three_greedy_columns(parley, max_tokens=6)
    view.one_at_a_time.setChecked(True)
    assert view.send("first")
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert view.send("in turns")
    waiting = view.columns[2]
    old = waiting.conv_id
    view.promote(waiting)
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert parley.store.path(waiting.conv_id) == []  # the column's new chat got no prompt of its own
    assert [m.content for m in parley.store.path(old) if m.role == "user"] == ["first"]



def test_two_quantizations_of_one_model_are_told_apart_in_the_labels(parley, qtbot, tiny_models_q8):
    key = parley.models.import_path(tiny_models_q8["qwen3"].gguf_path)  # its header names it "qwen3", as the F32 one
    qtbot.waitUntil(lambda: parley.models.model_id(key) is not None, timeout=60_000)
    parley.window.show_compare()
    view = parley.window.compare
    view.columns[1].set_model(key)
    listed = [parley.models.registry.get(k).name for k in ("default", key)]
    assert [c.label.full_text() for c in view.columns] == [f"A: {listed[0]}", f"B: {listed[1]}"]  # both read "qwen3"


def test_each_columns_buttons_name_their_column_for_the_keyboard(parley):
    parley.window.show_compare()
    names = [[b.accessibleName() for b in (c.settings_button, c.stop_button, c.promote_button)]
             for c in parley.window.compare.columns]
    assert names == [[f"Settings of column {x}", f"Stop column {x}", f"Make column {x} a chat"] for x in "AB"]


def _short_answers(parley):
    """The compare view on screen, its columns greedy and answering in four tokens; (view, their conversations)."""
    view = parley.window.compare
    parley.window.show_compare()
    convs = [c.conv_id for c in view.columns]
    for conv in convs:
        parley.service.set_settings(conv, parley.store.get(conv).settings.copy(temperature=0.0, max_tokens=4))
    return view, convs


def test_editing_a_columns_prompt_branches_every_column(parley, qtbot):
    view, convs = _short_answers(parley)
    assert view.send("first") and view.send("second")  # the second waits for the first answers
    qtbot.waitUntil(lambda: all(len(parley.store.path(c)) == 4 and not parley.service.busy(c) for c in convs),
                    timeout=60_000)
    first = parley.store.path(convs[1])[0]
    view.columns[1].view.activate(first, "edit:")  # its Edit link: nothing happened
    assert view.composer.edit.toPlainText() == "first" and "prompt 1" in view.composer.banner.text()
    view.composer.edit.setPlainText("first, edited")
    qtbot.keyClick(view.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: all(len(parley.store.path(c)) == 2 and not parley.service.busy(c) for c in convs),
                    timeout=60_000)
    for conv in convs:
        path = parley.store.path(conv)
        assert path[0].content == "first, edited" and path[1].state == "done"
        assert len(parley.store.versions(path[0])) == 2  # the old branch stays
    assert view.editing is None and not view.composer.banner.isVisible() and view.composer.edit.toPlainText() == ""
    view.columns[0].view.activate(parley.store.path(convs[0])[0], "edit:")
    qtbot.keyClick(view.composer.edit, Qt.Key.Key_Escape)  # given up: the next prompt is a new turn again
    assert view.editing is None and view.composer.edit.toPlainText() == ""


def test_two_columns_stand_side_by_side_in_an_800_px_window(parley, qtbot):
    parley.window.resize(800, 700)
    parley.window.show_compare()
    view = parley.window.compare
    view.columns[0].stop_button.show()  # as while it answers: the column grew 30 px wider
    qtbot.waitUntil(lambda: view.scroll.viewport().width() < 560)  # beside the sidebar: was one and a half columns
    qtbot.waitUntil(lambda: view.layout_mode == "row")
    assert all(c.geometry().right() < view.scroll.viewport().width() for c in view.columns)
    assert all(c.width() >= c.minimumSizeHint().width() for c in view.columns)


def test_beside_the_live_panel_two_columns_in_an_800_px_window_stand_one_above_the_other(parley, qtbot):
    """The Live panel left the comparison ~310 px: room for one column and a half, the second behind a sideways scroll
    bar. With the height for both, they stand one above the other, each whole."""
    parley.window.resize(800, 700)
    parley.window.live_panel.toggleViewAction().trigger()
    parley.window.show_compare()
    view = parley.window.compare
    qtbot.waitUntil(lambda: view.scroll.viewport().width() < 2 * COLUMN_MIN_WIDTH)
    qtbot.waitUntil(lambda: view.layout_mode == "stack")
    viewport = view.scroll.viewport().rect()
    assert all(viewport.contains(c.geometry()) for c in view.columns)
    assert view.scroll.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff


def test_columns_that_no_longer_fit_a_window_narrowed_meanwhile_scroll_sideways(parley, qtbot):
    parley.window.resize(1400, 700)
    parley.window.show_compare()
    view = parley.window.compare
    view.set_columns(3)
    qtbot.waitUntil(lambda: view.layout_mode == "row")
    parley.window.new_chat()
    qtbot.waitUntil(lambda: not view.isVisible())
    parley.window.resize(800, 700)  # narrowed on the chat page, then back to the comparison
    parley.window.show_compare()
    qtbot.waitUntil(lambda: view.scroll.viewport().width() < 600)
    assert view.layout_mode == "scroll"  # was a row as wide as before, the third column cut off, no scroll bar
    assert view.scroll.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAsNeeded


def test_a_columns_line_says_its_model_was_unloaded_and_loads_when_sent(parley, qtbot):
    view, convs = _short_answers(parley)
    assert view.send("hello")
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert parley.models.unload("default")  # Models > Unload
    assert all("not loaded: loads when you send" in c.stats.full_text() for c in view.columns)  # read 'qwen3 · … tok/s'
    assert view.send("again")
    qtbot.waitUntil(lambda: not view.busy() and parley.models.model_id("default") is not None, timeout=60_000)
    assert all("not loaded" not in c.stats.full_text() and "tok/s" in c.stats.text() for c in view.columns)


def test_tab_goes_round_the_compare_view_through_named_stops_only(parley, qtbot):
    parley.window.show_compare()
    view = parley.window.compare
    view.composer.edit.setFocus()
    stops = []
    for _ in range(30):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        if QApplication.focusWidget() is view.composer.edit:
            break
        stops.append(QApplication.focusWidget())
    assert view.composer.edit.hasFocus() and view.scroll not in stops  # the columns' scroll area: a silent stop
    assert all(w.accessibleName() or getattr(w, "text", str)() for w in stops)  # each says what it is


def test_closing_the_app_while_one_column_answers_at_a_time_leaves_the_others_no_error(parley, qtbot):
    view, convs = _short_answers(parley)
    view.one_at_a_time.setChecked(True)
    hold_engine(parley, 0.3)
    assert view.send("first")
    assert parley.service.busy(convs[0]) and parley.store.path(convs[1]) == []  # B waits its turn
    parley.bridge.shutdown()  # as the window's close does
    assert parley.store.path(convs[1]) == []  # was its prompt and 'The engine has shut down; restart Parley …'


def test_a_columns_line_names_the_model_picked_since_its_last_answer(parley, qtbot, imported_llama):
    view, convs = _short_answers(parley)
    assert view.send("hello")
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert view.columns[1].stats.full_text().startswith("qwen3") and "tok/s" in view.columns[1].stats.text()
    view.columns[1].set_model(imported_llama)  # loaded: the line read 'qwen3 · … tok/s' under 'B: llama'
    assert view.columns[1].stats.full_text().startswith("llama") and "— tok/s" in view.columns[1].stats.full_text()
    assert view.columns[0].stats.full_text().startswith("qwen3") and "— tok/s" not in view.columns[0].stats.full_text()


def test_a_copy_of_the_embedded_model_imported_before_its_first_load_is_the_embedded_model(qtbot, qapp, tiny_models,
                                                                                          tmp_path):
    import shutil

    from app.core.sqlite_registry import SqliteModelRegistry
    from app.core.sqlite_store import SqliteConversationStore
    from app.qt.bridge import EngineBridge
    from app.qt.model_manager import ModelManager
    from engine.loading.default_model import FILE_NAME
    from engine.runtime import EngineConfig
    from tests.app.conftest import TINY_ENGINE

    (tmp_path / "models").mkdir()  # the embedded model as its first start assembled it, not loaded yet
    shutil.copy(tiny_models["qwen3"].gguf_path, tmp_path / "models" / FILE_NAME)
    shutil.copy(tiny_models["qwen3"].gguf_path, tmp_path / "my-copy.gguf")
    bridge = EngineBridge(EngineConfig(**TINY_ENGINE)).start()
    registry = SqliteModelRegistry(SqliteConversationStore(tmp_path / "p.db"), legacy_file=tmp_path / "m.json")
    models = ModelManager(bridge, registry, tmp_path / "models")
    try:
        with qtbot.waitSignal(models.already_there, timeout=10_000) as same:
            models.import_path(tmp_path / "my-copy.gguf")  # was imported and loaded as a model of its own
        assert same.args[1] == "default" and [e.key for e in registry.entries()] == ["default"]
    finally:
        bridge.shutdown()


def test_the_compare_box_and_its_queued_prompts_come_back_after_a_restart(qtbot, qapp, tiny_models, tmp_path):
    from tests.app.helpers import start_app

    app = start_app(qtbot, tmp_path / "data", tiny_models)
    view = app.window.compare
    app.window.show_compare()
    hold_engine(app, 0.3)
    assert view.send("first") and view.send("second, queued")  # the second waits for the first answers
    view.composer.edit.setPlainText("third, half typed")
    app.close()
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        view = app.window.compare
        assert view.composer.edit.toPlainText() == "second, queued\n\nthird, half typed"  # was empty
        first = view.columns[0].conv_id
        view.promote(view.columns[0])
        assert app.service.draft(first) == "" and app.window.chat.composer.edit.toPlainText() == ""
        assert app.service.draft(view.columns[0].conv_id) == view.composer.edit.toPlainText() != ""
    finally:
        app.close()


def test_text_typed_in_an_empty_comparison_stays_in_the_box_when_another_is_opened(parley, qtbot):
    view, convs = _short_answers(parley)
    old = view.group_id
    assert view.send("an old comparison")
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    view.clear()
    view.composer.edit.setPlainText("typed in the new one")
    view.open_group(old)  # the empty comparison goes
    assert view.group_id == old and view.composer.edit.toPlainText() == "typed in the new one"


def test_columns_left_waiting_their_turn_at_a_restart_are_offered_the_prompt(qtbot, qapp, tiny_models, tmp_path):
    from tests.app.helpers import start_app

    app = start_app(qtbot, tmp_path / "data", tiny_models)
    view = app.window.compare
    app.window.show_compare()
    view.one_at_a_time.setChecked(True)
    hold_engine(app, 0.3)
    assert view.send("first")
    app.close()  # column A answering, B waiting its turn
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        view = app.window.compare
        convs = [c.conv_id for c in view.columns]
        assert app.store.path(convs[1]) == []  # B came back empty: the comparison lopsided, nothing said
        assert view.queued.isVisibleTo(view) and "column B: “first”" in view.queued.text()
        view.queued.linkActivated.emit("catch-up:")
        qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
        prompts = [[m.content for m in app.store.path(c) if m.role == "user"] for c in convs]
        assert prompts == [["first"], ["first"]] and app.store.path(convs[1])[-1].state == "done"
        assert not view.queued.isVisibleTo(view)
    finally:
        app.close()


def test_a_column_names_its_model_as_the_picker_lists_it(parley, qtbot):
    view, convs = _short_answers(parley)
    listed = parley.models.registry.get("default").name
    assert view.send("hello")
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    column = view.columns[0]
    assert column.picker.currentText() == listed  # the file's own name ('qwen3') read differently
    assert column.label.full_text() == f"A: {listed}" and column.stats.full_text().startswith(f"{listed}  · ")


def test_a_model_picked_mid_answer_renames_the_column_when_that_answer_ends(parley, qtbot, imported_llama):
    view, convs = _short_answers(parley)
    old, new = (parley.models.registry.get(k).name for k in ("default", imported_llama))
    hold_engine(parley, 0.3)
    assert view.send("hello")
    qtbot.waitUntil(lambda: parley.service.live(convs[1]).turn.turn_id is not None, timeout=10_000)
    view.columns[1].set_model(imported_llama)  # the answer goes on from the old model
    assert view.columns[1].label.full_text() == f"B: {old}" and view.columns[1].stats.full_text().startswith(old)
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert view.columns[1].label.full_text() == f"B: {new}"  # the next answer's model


def test_removing_a_model_counts_a_comparisons_columns_as_one_comparison(parley, qtbot, imported_llama):
    from tests.app.helpers import configure

    w = parley.window
    configure(parley, w.chat.conv_id, model=imported_llama)
    w.show_compare()
    for column in w.compare.columns:  # both columns of the comparison on the model about to go
        column.set_model(imported_llama)
    dialog = w.show_models()
    dialog.table.setCurrentItem(dialog.table.topLevelItem(1))
    dialog.remove_button.click()
    assert "1 chat and 1 comparison moved to" in w.statusBar().currentMessage()  # was '3 chats moved to'
    dialog.close()


def test_a_prompt_too_long_for_every_column_comes_back_to_the_box(parley, qtbot):
    """Each column held the prompt and its error ('Shorten it.') and the box was empty: nothing to shorten."""
    view, convs = _short_answers(parley)
    prompt = "hello " * 300  # 1,211 tokens of the tiny model's 512
    view.composer.edit.setPlainText(prompt)
    qtbot.keyClick(view.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert view.queued.isVisible()
    assert [parley.store.path(c) for c in convs] == [[], []]
    assert view.composer.edit.toPlainText() == prompt.strip()
    note = view.queued.text()
    assert note.startswith("<b>Not sent:</b> too long for every column; the prompt is back in the box.")
    assert "<br>A: The message needs 1,211 tokens" in note and "<br>B: The message needs 1,211 tokens" in note


def test_a_prompt_too_long_for_one_column_stays_in_it_with_its_error(parley, qtbot):
    view, convs = _short_answers(parley)
    settings = parley.store.get(convs[1]).settings
    parley.service.set_settings(convs[1], settings.copy(system_prompt="word " * 100))  # B's prompt goes past 512
    view.send("hello " * 100)
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert view.queued.isVisible()
    answers = [parley.store.path(c)[-1] for c in convs]
    assert [a.state for a in answers] == ["done", "error"] and "the context holds 512" in answers[1].error
    assert view.queued.text().startswith("<b>Not answered in column B:</b> the prompt is too long there.")
    assert "<br>" not in view.queued.text()  # its reason is B's error, not said twice
    view.send("short")  # the next prompt goes to both, and the note with it
    assert not view.queued.isVisible()
    qtbot.waitUntil(lambda: not view.busy(), timeout=60_000)
    assert [parley.store.path(c)[-2].content for c in convs] == ["short", "short"]


def test_stop_all_in_the_live_panel_stops_the_columns_waiting_their_turn(parley, qtbot):
    """Columns waiting their turn (one at a time) and a prompt queued behind went on once the answering one stopped."""
    view, convs = _short_answers(parley)
    view.one_at_a_time.setChecked(True)
    hold_engine(parley, 0.3)  # column A's turn waits in the engine
    view.send("first")
    view.send("second")  # queued behind the columns' answers
    parley.window.live_panel.stop_all()
    qtbot.waitUntil(lambda: parley.store.path(convs[0])[-1].state == "stopped", timeout=10_000)
    assert parley.store.path(convs[1]) == [] and not view.busy()  # B's turn began as A's ended
    assert view.composer.edit.toPlainText() == "second"
