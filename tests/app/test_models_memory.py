"""The app when a model does not fit the free memory: one line in the chat and the model list, the rest goes on."""
from __future__ import annotations

from tests.app.helpers import configure, last, wait_idle


def test_a_model_refused_for_memory_leaves_the_app_usable(parley, qtbot, imported_llama, monkeypatch):
    from app.qt.models_dialog import ModelsDialog

    w = parley.window
    first = w.current()
    configure(parley, first, temperature=0.0, max_tokens=4)
    parley.models.unload(imported_llama)
    qtbot.waitUntil(lambda: parley.models.state(imported_llama) is None)
    monkeypatch.setattr("engine.memory.available_bytes", lambda device: 1 << 20)
    other = w.new_chat()
    configure(parley, other, temperature=0.0, max_tokens=4, model=imported_llama)
    w.open_chat(other)
    w.chat.send("on llama")
    wait_idle(parley, qtbot, other)
    refused = last(parley, other)
    assert refused.state == "error" and "needs ~" in refused.error and "\n" not in refused.error
    state = parley.models.state(imported_llama)
    assert state.status == "failed" and state.message in refused.error
    row = dict(zip(("name", "status"), ModelsDialog(parley.models).rows()[1]))
    assert row["status"] == "failed"
    w.open_chat(first)
    w.chat.send("still here")  # the loaded model answers on
    wait_idle(parley, qtbot, first)
    assert last(parley, first).state == "done"
    monkeypatch.undo()  # memory freed: the next turn loads it
    w.open_chat(other)
    w.chat.send("again")
    wait_idle(parley, qtbot, other)
    assert last(parley, other).state == "done" and parley.models.model_id(imported_llama) is not None


def test_model_sizes_read_in_mb_or_gb(parley, imported_llama):
    """The model list and About showed a small model as "0 MB" and an 8B one as "4,943 MB" (About "4943 MB")."""
    import re

    from app.qt.about import about_html
    from app.qt.models_dialog import ModelsDialog

    memory = {row[0]: row[6] for row in ModelsDialog(parley.models).rows()}
    assert all(re.fullmatch(r"\d\.\d MB", m) for m in memory.values()), memory
    assert " 0 MB in memory" not in about_html(parley.models) and " MB in memory" in about_html(parley.models)
    from app.qt.models_dialog import size_text
    assert [size_text(n) for n in (4943.2e6, 249.4e6, 12.3e6, 0.4e6, 38_512e6)] == \
        ["4.9 GB", "249 MB", "12 MB", "0.4 MB", "38.5 GB"]
