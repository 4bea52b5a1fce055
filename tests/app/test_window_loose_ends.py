"""The window after unloads, model switches and restarts: what it says is what is true at once."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.app.helpers import hold_engine, start_app, wait_idle


def _load_again(parley, qtbot, key: str = "default") -> None:
    """Unloaded and loaded again: the bar's '… loaded' is this load's (no start's notice in its way)."""
    parley.models.unload(key)
    parley.window.statusBar().clearMessage()
    with qtbot.waitSignal(parley.models.loaded, timeout=60_000):
        parley.models.ensure(key)


def _say(app, qtbot, conv: int, text: str) -> None:
    """A short answer (4 tokens) to `text`."""
    app.service.set_settings(conv, app.store.get(conv).settings.copy(max_tokens=4))
    app.window.chat.send(text)
    wait_idle(app, qtbot, conv)


def test_the_bar_stops_saying_loaded_once_the_model_is_unloaded(parley, qtbot):
    """'qwen3 loaded' stayed up for its 4 s after Unload, beside the chat's 'not loaded: loads when you send'."""
    _load_again(parley, qtbot)
    bar = parley.window.statusBar()
    assert bar.currentMessage().endswith(" loaded")
    parley.models.unload("default")
    assert bar.currentMessage() == ""


def test_an_unload_leaves_another_message_up(parley, qtbot, imported_llama):
    """Only the unloaded model's own '… loaded' goes: a message about something else stays its time."""
    _load_again(parley, qtbot)
    bar = parley.window.statusBar()
    parley.models.unload(imported_llama)  # not the model the bar names
    assert bar.currentMessage().endswith(" loaded")
    bar.showMessage("Deleted “a chat”.", 10_000)
    parley.models.unload("default")
    assert bar.currentMessage() == "Deleted “a chat”."


def test_a_load_given_up_stops_counting_in_the_bar(parley, qtbot, imported_llama):
    """Unloaded while it loaded, its 'Loading llama: … · 3 s' stayed in the bar until another model loaded."""
    w, models = parley.window, parley.models
    models.unload(imported_llama)
    models.ensure(imported_llama)
    assert w.load_label.full_text().startswith("Loading ")
    with qtbot.waitSignal(models.failed, timeout=10_000):
        models.unload(imported_llama)
    assert w.load_label.full_text() == "" and not w.load_progress.isVisible()


def _answering_then_switched(parley, qtbot, to: str) -> tuple[int, object]:
    """A chat whose answer on the default model is under way (the engine held) when another model is picked."""
    service, conv = parley.service, parley.window.current()
    hold_engine(parley, 1.0)  # the turn is submitted and waits: it has an id, no answer yet
    parley.window.chat.send("hello")
    live = service.live(conv)
    assert live.turn.turn_id is not None and live.model_key == "default"
    service.set_settings(conv, parley.store.get(conv).settings.copy(model=to))
    return conv, live


def test_a_failure_after_another_model_was_picked_and_unloaded_is_not_called_an_unload(parley, qtbot, imported_llama):
    """The turn's model is still loaded: its failure is its own. Judged by the model picked since (unloaded), it read
    'The model was unloaded before it answered', where the close of the same turn's session read it of the model it
    ran on."""
    from app.core.chats import MODEL_GONE

    conv, live = _answering_then_switched(parley, qtbot, imported_llama)
    parley.models.unload(imported_llama)
    parley.bridge.turn_failed.emit(live.session_id, live.turn.turn_id, "Out of memory while reading the prompt.", "")
    answer = parley.store.path(conv)[-1]
    assert answer.state == "error" and answer.error == "Out of memory while reading the prompt."
    assert answer.error != MODEL_GONE


def test_the_model_that_answered_going_is_called_an_unload_whatever_was_picked_since(parley, qtbot, imported_llama):
    conv, live = _answering_then_switched(parley, qtbot, imported_llama)
    parley.models.unload("default")  # the model the answer runs on; the one picked stays loaded
    wait_idle(parley, qtbot, conv)
    answer = parley.store.path(conv)[-1]
    assert answer.state in ("error", "stopped") and "unloaded" in answer.error, answer.error


def test_an_answer_is_named_as_the_model_list_names_its_model(parley, qtbot):
    """Answers were headed by the file's own name ('qwen3') where the picker, the Models dialog and a compare column
    read 'qwen3-f32.gguf'; the bar's '… loaded' and the status line too."""
    w, conv = parley.window, parley.window.current()
    listed = w.chat.picker.currentText()
    assert listed == parley.models.registry.get("default").name and listed != parley.models.state("default").own_name
    _load_again(parley, qtbot)
    assert w.statusBar().currentMessage() == f"{listed} loaded"
    _say(parley, qtbot, conv, "hello")
    answer = parley.store.path(conv)[-1]
    assert answer.state == "done" and answer.model == listed
    assert w.chat.status.text.full_text().startswith(f"{listed}  ·  ")


def test_an_answer_saved_under_the_file_s_own_name_reads_as_listed(parley, qtbot):
    """A chat saved before keeps its answers; its status line (and a compare column's, which took a name other than
    the loaded model's for 'another model picked since' and dropped the figures) names the model as listed."""
    w, conv, state = parley.window, parley.window.current(), parley.models.state("default")
    _say(parley, qtbot, conv, "hello")
    answer = parley.store.path(conv)[-1]
    parley.store.update_message(answer.id, model=state.own_name)  # as an answer of the last version was saved
    shown = parley.service.status(conv)
    assert shown.model == state.name == w.chat.picker.currentText() and shown.tokens_per_s


def test_a_chat_whose_model_is_not_loaded_names_it_in_its_status_line(parley, qtbot):
    """A new chat with its model unloaded read 'model not loaded yet · not loaded: loads when you send'."""
    w = parley.window
    parley.models.unload("default")
    assert w.chat.status.text.full_text().startswith(f"{w.chat.picker.currentText()}  ·  not loaded: loads when")


def test_the_models_dialog_tells_what_a_chat_holds_of_the_model_s_own_context(qtbot, qapp, tiny_models, tmp_path):
    """'Context' read the engine's cap per chat (4,096 for the embedded Gemma, made for 32,768) beside a small model's
    own 2,048, with nothing to tell which was which."""
    from app.qt.main import build
    from app.qt.models_dialog import CONTEXT_COLUMN, ModelsDialog
    from engine.runtime import EngineConfig
    from tests.app.conftest import TINY_ENGINE

    config = EngineConfig(**{**TINY_ENGINE, "max_session_tokens": 256})  # under the tiny model's own 512
    app = build(str(tmp_path / "data"), default_model=str(tiny_models["qwen3"].gguf_path), engine=config,
                theme="light", show=False)
    qtbot.addWidget(app.window)
    try:
        models = app.models
        qtbot.waitUntil(lambda: getattr(models.state("default"), "own_context", None) is not None, timeout=60_000)
        own = app.bridge.engine.loaded_model(models.model_id("default")).args.max_position_embeddings
        dialog = ModelsDialog(models)
        qtbot.addWidget(dialog)
        assert dialog.rows()[0][CONTEXT_COLUMN] == f"256 of {own:,}" and own == 512
        assert dialog.table.headerItem().text(CONTEXT_COLUMN) == "Context per chat"
        assert "a chat holds up to 256 tokens" in dialog.table.headerItem().toolTip(CONTEXT_COLUMN)
    finally:
        app.bridge.shutdown()


def test_a_model_s_own_context_read_after_the_dialog_opened_shows_at_once(parley, qtbot):
    """A model loaded while the dialog is open: its cell gains the model's own context when it is read."""
    from app.qt.models_dialog import CONTEXT_COLUMN, ModelsDialog

    models = parley.models
    models.unload("default")
    dialog = ModelsDialog(models)
    qtbot.addWidget(dialog)
    with qtbot.waitSignal(models.context_known, timeout=60_000):
        models.ensure("default")
    assert dialog._shown()[0][1][CONTEXT_COLUMN] == "512 of 512"  # the tiny model's own is the tests' cap


def test_an_edit_in_progress_reopens_as_the_edit_after_a_restart(qtbot, qapp, tiny_models, tmp_path):
    """It came back as plain text in the box, before the chat's draft: the message no longer marked as being edited,
    no Cancel, and Send sent it as a new message."""
    app = start_app(qtbot, tmp_path / "data", tiny_models)
    w, conv = app.window, app.window.current()
    _say(app, qtbot, conv, "hi")
    w.chat.composer.edit.setPlainText("a draft of my own")
    user = app.store.path(conv)[0]
    w.chat.view.activate(user, "edit:")  # the message's Edit link
    w.chat.composer.edit.setPlainText("hi, edited")
    app.close()
    again = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        chat = again.window.chat
        assert chat.conv_id == conv and chat.editing == user.id and chat.composer.banner.isVisible()
        assert chat.composer.edit.toPlainText() == "hi, edited"
        chat.composer.cancel_edit()
        assert chat.editing is None and chat.composer.edit.toPlainText() == "a draft of my own"
        assert again.service.open_edit(conv) is None
    finally:
        again.close()


def test_saved_edits_that_do_not_read_are_said_and_left_out(tmp_path):
    import json

    from app.core.app_settings import AppSettings

    file = tmp_path / "settings.json"
    file.write_text(json.dumps({"edits": {"3": [5, "half an edit"], "x": [1, "a"], "4": "no message"}}))
    s = AppSettings.load(file)
    assert s.edits == {3: (5, "half an edit")}
    assert [u.split(" ")[0] for u in s.unread] == ["edits.x", "edits.4"]


def test_a_model_picked_after_an_answer_is_the_one_the_status_line_says_loads(parley, qtbot, imported_llama):
    """'qwen3-f32.gguf · loading: Preparing · 46.6 tok/s' while llama loaded: the load named the last answer's model,
    with its figures."""
    w, conv = parley.window, parley.window.current()
    _say(parley, qtbot, conv, "hello")
    parley.models.unload(imported_llama)
    w.chat.picker.setCurrentIndex(w.chat.picker.findData(imported_llama))
    line = w.chat.status.text.full_text()
    assert line.startswith(f"{w.chat.picker.currentText()}  ·  loading: ") and "— tok/s" in line, line


def test_the_picker_follows_settings_set_elsewhere(parley, qtbot, imported_llama):
    """A chat's (or a column's) model set by other code than its picker: the picker kept naming the model before."""
    w, service, conv = parley.window, parley.service, parley.window.current()
    service.set_settings(conv, parley.store.get(conv).settings.copy(model=imported_llama))
    assert w.chat.picker.key() == imported_llama and w.chat.picker.currentText() == "llama-f32"
    w.show_compare()
    column = w.compare.columns[1]
    service.set_settings(column.conv_id, parley.store.get(column.conv_id).settings.copy(model=imported_llama))
    assert column.picker.key() == imported_llama

def _shown(view, msg) -> str:
    """A message as its chat view draws it (its header, text and note)."""
    return view.delegate.document(msg)[0].toPlainText()


def _writer(view, msg) -> str:
    """The name heading an answer (before its seed)."""
    return _shown(view, msg).split("\n")[1].split(" · ")[0]


def test_an_unload_note_names_the_model_picked_since(parley, qtbot, imported_llama):
    """'Continue or Regenerate loads it again' stayed after another model was picked, where they answer with that one."""
    w, conv = parley.window, parley.window.current()
    parley.service.set_settings(conv, parley.store.get(conv).settings.copy(max_tokens=4))
    hold_engine(parley, 0.3)  # the turn is submitted, then its model unloaded under it
    w.chat.send("hello")
    parley.models.unload("default")
    wait_idle(parley, qtbot, conv)
    answer = parley.store.path(conv)[-1]
    assert "loads it again" in _shown(w.chat.view, answer)
    w.chat.picker.setCurrentIndex(w.chat.picker.findData(imported_llama))
    note = _shown(w.chat.view, answer)
    assert "Continue or Regenerate uses llama-f32, the chat's model now" in note and "loads it again" not in note
    w.chat.picker.setCurrentIndex(w.chat.picker.findData("default"))
    assert "Continue or Regenerate loads it again" in _shown(w.chat.view, answer)  # the model that answered, again
    w.chat.picker.setCurrentIndex(w.chat.picker.findData(imported_llama))
    w.chat.view.activate(answer, "regen:")
    wait_idle(parley, qtbot, conv)
    assert parley.store.path(conv)[-1].model == "llama-f32"  # Regenerate answered with the model the note named


def test_answers_saved_under_a_file_s_own_name_are_headed_as_listed(parley, qtbot):
    """Answers of older versions (saved under 'qwen3') were headed so, new ones 'qwen3-f32.gguf'. A model known (loaded
    since the start, unloaded since too) is named as listed; a name no model known has is shown as saved."""
    w, conv, state = parley.window, parley.window.current(), parley.models.state("default")
    _say(parley, qtbot, conv, "hello")
    answer = parley.store.path(conv)[-1]
    parley.store.update_message(answer.id, model=state.own_name)  # as the last version saved it
    parley.models.unload("default")
    listed = w.chat.picker.currentText()
    assert _writer(w.chat.view, answer) == listed
    index = w.chat.view.model().index(1, 0)
    assert w.chat.view.model().data(index, Qt.ItemDataRole.AccessibleTextRole).startswith(listed)
    parley.store.update_message(answer.id, model="a model gone since")
    assert _writer(w.chat.view, answer) == "a model gone since"
    parley.store.update_message(answer.id, model="")  # a file that saved none
    assert _writer(w.chat.view, answer) == "Assistant"


def test_answers_of_a_model_not_loaded_since_the_start_are_headed_as_listed(parley, qtbot, tiny_models):
    """An older answer saved under its file's own name ('llama') by a model listed but not loaded since the start was
    headed so, where a loaded model's read as listed ('llama-f32'): the own name is read from the file's header."""
    from app.core.model_registry import ModelEntry

    path = str(tiny_models["llama"].gguf_path)
    parley.models.registry.add(ModelEntry(path, "llama-f32", path, "gguf"))  # listed, never loaded
    w, conv = parley.window, parley.window.current()
    _say(parley, qtbot, conv, "hello")
    answer = parley.store.path(conv)[-1]
    parley.store.update_message(answer.id, model="llama")  # as an older version saved the llama's answer
    w.chat.open(conv)
    qtbot.waitUntil(lambda: w.chat.status.text.full_text().startswith("llama-f32  · "), timeout=10_000)
    assert _writer(w.chat.view, answer) == "llama-f32"
    assert parley.models.state(path) is None  # its weights were not loaded for the name


@pytest.mark.parametrize("name, own", [("n" * 300, "tiny-model"), ("\x1b]0;pwned\x07model", "tiny-model"),
                                       ("Tiny Llama 3.2", "Tiny Llama 3.2")])
def test_a_file_s_own_name_read_without_loading_is_the_one_its_load_gives(tiny_models, tmp_path, name, own):
    """Answers are named as listed by the own name their load would give: a name a load does not show is none."""
    import gguf

    from app.qt.model_manager import own_name
    from tests.engine.test_hostile_gguf import read_layout

    path = read_layout(tiny_models["llama"].gguf_path).set("general.name", gguf.GGUFValueType.STRING, name)
    assert own_name(str(path.write(tmp_path / "tiny-model.gguf"))) == own
