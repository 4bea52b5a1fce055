"""GUI tests: the real window on the real engine thread, offscreen, with a tmp data dir and tiny models."""
from __future__ import annotations

import gc
import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before any Qt import

import pytest

from engine.runtime import EngineConfig

TINY_ENGINE = dict(max_sessions=4, max_session_tokens=512, step_tokens=64, chunk_tokens=32)


def record_turns(engine) -> None:
    """Keeps what every turn hands the engine in `engine.sent` (the app owns the conversation; tests check it)."""
    engine.sent, real = [], engine.submit

    def submit(sid, messages, params=None, system_prompt=None, continue_final=False):
        engine.sent.append({"sid": sid, "messages": [dict(m) for m in messages], "params": params,
                            "system": system_prompt, "continue_final": continue_final})
        return real(sid, messages, params, system_prompt, continue_final)

    engine.submit = submit


@pytest.fixture(autouse=True)
def _automatic_gc_back():
    """An app's GuiThreadCollector turns automatic collection off while it runs; the next test starts with it on."""
    yield
    gc.enable()


@pytest.fixture
def parley(qtbot, qapp, tiny_models, tmp_path):
    """The app on the tiny Qwen3 (as its default model), ready to chat."""
    from app.qt.main import build

    gc.collect()  # earlier tests' Qt cycles are freed here, on the GUI thread, not by a collection on a worker thread
    app = build(str(tmp_path / "data"), default_model=str(tiny_models["qwen3"].gguf_path),
                engine=EngineConfig(**TINY_ENGINE), theme="light", show=False)
    record_turns(app.bridge.engine)
    qtbot.addWidget(app.window)
    app.window.show()
    qtbot.waitUntil(lambda: app.models.model_id("default") is not None, timeout=60_000)
    yield app
    app.bridge.shutdown()


@pytest.fixture
def imported_llama(parley, qtbot, tiny_models) -> str:
    """The tiny Llama imported from disk: a second model in the registry."""
    key = parley.models.import_path(tiny_models["llama"].gguf_path)
    qtbot.waitUntil(lambda: parley.models.registry.get(key) is not None, timeout=60_000)
    return key
