"""The window after unloads, model switches and restarts: what it says is what is true at once."""
from __future__ import annotations


def _load_again(parley, qtbot, key: str = "default") -> None:
    """Unloaded and loaded again: the bar's '… loaded' is this load's (no start's notice in its way)."""
    parley.models.unload(key)
    parley.window.statusBar().clearMessage()
    with qtbot.waitSignal(parley.models.loaded, timeout=60_000):
        parley.models.ensure(key)


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
