"""A model the engine lets go: whoever asked, the app hears ModelUnloaded (the bridge forwarded none), shows it
unloaded, collects what it left, and loads it again for the next answer."""
from __future__ import annotations

import gc
import threading
import weakref

from tests.app.helpers import last, wait_idle


def test_a_model_the_engine_unloads_shows_unloaded_and_its_chat_loads_it_again(parley, qtbot):
    """Unloaded by a caller of the engine's own, the models dialog still read 'loaded' with Unload enabled, nothing
    collected what it left, and the chat's next turn opened a session on the id that was gone and failed."""
    from app.qt.models_dialog import KEY_ROLE, ModelsDialog

    models, chat = parley.models, parley.window.current()
    dialog = ModelsDialog(models)
    qtbot.addWidget(dialog)
    row = next(dialog.table.topLevelItem(i) for i in range(dialog.table.topLevelItemCount())
               if dialog.table.topLevelItem(i).data(0, KEY_ROLE) == "default")
    dialog.table.setCurrentItem(row)
    assert dialog._shown()[0][1][1] == "loaded" and dialog.unload_button.isEnabled()
    with qtbot.waitSignals([models.changed, models.freezer.thawed], timeout=30_000):
        parley.bridge.engine.unload_model(models.model_id("default"))
    assert models.model_id("default") is None and models.state("default") is None
    assert dialog._shown()[0][1][1] == "not loaded"
    assert not dialog.unload_button.isEnabled() and dialog.load_button.isEnabled()
    parley.window.chat.send("hello again")
    wait_idle(parley, qtbot, chat)
    assert last(parley, chat).state == "done" and last(parley, chat).content
    assert models.model_id("default") is not None


def test_an_unloaded_model_s_template_is_not_left_frozen(parley, qtbot):
    """The collection after an unload ran while the engine thread still held the model (a loop variable of the drain
    that unloaded it, until the drain's later commands had run): its chat template's cycles were frozen, kept until the
    next unload (3-6 unloads in 30 of the embedded model). The engine is held inside that drain here until the app
    has collected."""
    engine, models = parley.bridge.engine, parley.models
    model_id = models.model_id("default")
    template = engine.call(lambda e: e._hosts[model_id].runtime.lm.tokenizer.chat_template)
    env = weakref.ref(template._template.environment)
    del template
    first, second = threading.Event(), threading.Event()
    engine._post(first.wait, 30)  # the drain that runs the unload begins before it
    with qtbot.waitSignal(models.freezer.thawed, timeout=30_000):
        models.unload("default")
        engine._post(second.wait, 30)  # and ends only after the app has collected
        first.set()
    second.set()
    engine.call(lambda e: None)  # that drain has returned
    gc.collect()  # frozen objects are not walked: only a thaw's collection frees them
    assert env() is None
