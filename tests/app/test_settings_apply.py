"""Settings that a model or machine cannot honour are said, not dropped: the load's notices reach the window."""
from __future__ import annotations

import html

import pytest

pytest.importorskip("PySide6")

from PySide6.QtGui import QAction  # noqa: E402
from PySide6.QtWidgets import QDialog, QPlainTextEdit  # noqa: E402

from engine.runtime import EngineConfig
from tests.app.conftest import TINY_ENGINE


@pytest.fixture
def quantized_app(qtbot, qapp, tiny_models, tmp_path):
    """The app as settings.json {"weights": "quantized"} builds its engine, on the tiny Qwen3 GGUF."""
    from app.qt.main import build

    app = build(str(tmp_path / "data"), default_model=str(tiny_models["qwen3"].gguf_path),
                engine=EngineConfig(weights="quantized", **TINY_ENGINE), theme="light", show=False)
    qtbot.addWidget(app.window)
    qtbot.waitUntil(lambda: app.models.model_id("default") is not None, timeout=60_000)
    yield app
    app.bridge.shutdown()


def test_weights_quantized_with_a_folder_is_said_in_the_status_bar(quantized_app, qtbot, tiny_models):
    """An imported Hugging Face folder loaded floats under weights "quantized" and the window said only 'Imported'."""
    folder = tiny_models["llama"].hf_dir
    key = quantized_app.models.import_path(folder)
    qtbot.waitUntil(lambda: quantized_app.models.model_id(key) is not None, timeout=30_000)
    assert quantized_app.models.state(key).info["quantization"] == "float32"
    shown = quantized_app.window.statusBar().currentMessage()
    assert f"{folder.name} is a Hugging Face folder, whose matrices load as floats" in shown
    assert shown.startswith('Weights "quantized"')  # in place of "Imported tiny-llama": the bar has one line


def test_a_long_message_is_read_whole_and_the_next_one_loses_none(quantized_app, qtbot, tiny_models):
    """The bar is one line: the load's notice ran past the window's edge, cut, and the next message replaced it for
    good. Its tooltip now holds the message up, whole, and View ▸ Recent messages… lists every one."""
    window = quantized_app.window
    window.resize(800, 600)
    key = quantized_app.models.import_path(tiny_models["llama"].hf_dir)
    qtbot.waitUntil(lambda: quantized_app.models.model_id(key) is not None, timeout=30_000)
    bar = window.statusBar()
    notice = bar.currentMessage()
    assert notice.startswith('Weights "quantized"') and bar.fontMetrics().horizontalAdvance(notice) > bar.width()
    assert bar.toolTip() == f"<p>{html.escape(notice)}</p>"
    window.delete_current()  # the next message: "Deleted “…”."
    assert bar.currentMessage().startswith("Deleted") and [m for _, m in window.messages.entries][-2:] == [
        notice, bar.currentMessage()]
    action = next(a for a in window.findChildren(QAction) if a.text() == "Recent messages…")
    action.trigger()
    dialog = next(d for d in window.findChildren(QDialog) if d.windowTitle() == "Recent messages")
    shown = dialog.findChild(QPlainTextEdit).toPlainText().splitlines()
    assert shown[-2].endswith(f"  {notice}") and "  Deleted" in shown[-1]
    dialog.close()


def test_a_drafter_the_model_cannot_use_is_said_when_it_loads(parley, qtbot, imported_llama):
    """Models → Draft with it, a model of another tokenizer: the chat model loaded drafting from its prompt, unsaid."""
    assert parley.models.use_as_draft(imported_llama)
    parley.models.unload("default")
    parley.models.ensure("default")  # the draft model applies to models loaded from now on
    qtbot.waitUntil(lambda: parley.models.model_id("default") is not None, timeout=30_000)
    assert "cannot draft for" in parley.window.statusBar().currentMessage()


THINKING_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                     "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}")


def test_thinking_is_greyed_for_a_model_whose_template_has_no_switch(parley, qtbot, imported_llama, tiny_models,
                                                                      tmp_path):
    """Thinking 'Answer without thinking' on a model whose template has no switch answered the same, unsaid; greyed
    once the model had loaded, open before it loaded (or while it loaded): its file's header says it from the start."""
    import shutil

    from app.core.chat_settings import ChatSettings
    from app.qt.settings_dialog import SettingsDialog, thinking_switch_of

    qtbot.waitUntil(lambda: parley.models.model_id(imported_llama) is not None, timeout=30_000)
    switch = thinking_switch_of(parley.models)
    assert switch(imported_llama) is False
    parley.models.unload(imported_llama)  # not loaded: its file's template says it, once read off the GUI thread
    with qtbot.waitSignal(switch.known, timeout=10_000):
        assert switch(imported_llama) is None  # not known while it is read
    assert switch(imported_llama) is False
    thinker = shutil.copytree(tiny_models["llama"].hf_dir, tmp_path / "thinker")
    (thinker / "chat_template.jinja").write_text(THINKING_TEMPLATE, encoding="utf-8")
    key = parley.models.import_path(thinker)
    qtbot.waitUntil(lambda: switch(key) is True, timeout=10_000)  # before its load: the folder's template has the switch
    qtbot.waitUntil(lambda: parley.models.model_id(key) is not None, timeout=30_000)
    assert switch(key) is True  # its load says the same
    parley.models.unload(key)
    dialog = SettingsDialog(parley.models.registry, ChatSettings(model=imported_llama, thinking=False),
                            thinking_switch=switch)
    qtbot.addWidget(dialog)
    form = dialog.form
    assert not form.thinking.isEnabled() and form.thinking_note.isVisibleTo(form)
    assert "has no thinking switch" in form.thinking_note.text()
    assert dialog.settings().thinking is False  # kept, only greyed
    form.model.setCurrentIndex(form.model.findData(key))
    assert form.thinking.isEnabled() and not form.thinking_note.isVisibleTo(form)


def test_settings_opened_mid_answer_say_they_apply_from_the_next_one(parley, qtbot):
    """OK mid-answer kept the running answer on the settings it was sent with and the dialog said nothing."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.qt.settings_dialog import SettingsDialog
    from tests.app.helpers import configure, hold_engine, wait_idle

    w = parley.window
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=40)
    seen = []

    def look() -> None:
        dialog = next(d for d in QApplication.topLevelWidgets() if isinstance(d, SettingsDialog) and d.isVisible())
        seen.append(dialog.answering_note.isVisibleTo(dialog))
        dialog.reject()

    QTimer.singleShot(0, look)
    w.edit_settings()  # idle: no note
    hold_engine(parley, 0.5)
    w.chat.send("hello")
    assert parley.service.busy(conv)
    QTimer.singleShot(0, look)
    w.edit_settings()
    assert seen == [False, True]
    wait_idle(parley, qtbot, conv)


def test_a_drafter_chosen_says_the_loaded_models_keep_theirs(parley, imported_llama, qtbot):
    """Models → Draft with it marked the model 'drafts for the others' while the loaded ones went on as before."""
    qtbot.waitUntil(lambda: parley.models.model_id(imported_llama) is not None, timeout=30_000)
    parley.models.use_as_draft(imported_llama)
    shown = parley.window.statusBar().currentMessage()
    llama, qwen = parley.models.registry.get(imported_llama).name, parley.models.registry.default.name
    assert shown.startswith(f"{llama} drafts for models loaded from now on; {qwen} keeps drafting as before")
    parley.models.use_as_draft(None)
    assert parley.window.statusBar().currentMessage().startswith("Models loaded from now on draft from their prompts")
