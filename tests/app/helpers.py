"""Small helpers for driving the app in tests."""
from __future__ import annotations

TURN_TIMEOUT_MS = 60_000


def configure(app, conv_id: int, **changes) -> None:
    settings = app.store.get(conv_id).settings.copy(**changes)
    app.window.apply_settings(conv_id, settings)


def wait_idle(app, qtbot, *conv_ids: int, timeout: int = TURN_TIMEOUT_MS) -> None:
    qtbot.waitUntil(lambda: not any(app.service.busy(c) for c in conv_ids), timeout=timeout)


def last(app, conv_id: int):
    return app.store.path(conv_id)[-1]


def last_turn(app, conv_id: int) -> dict:
    """What the chat's latest turn handed the engine (recorded by tests/app/conftest.record_turns)."""
    sid = app.service.live(conv_id).session_id
    return [t for t in app.bridge.engine.sent if t["sid"] == sid][-1]


def handed(app, conv_id: int) -> list[str]:
    """The texts of the messages the chat's latest turn handed the engine."""
    return [m["content"] for m in last_turn(app, conv_id)["messages"]]


def start_app(qtbot, data_dir, tiny_models, **kwargs):
    """Another app instance on `data_dir` (what a restart gives), its default model loaded."""
    from app.qt.main import build
    from engine.runtime import EngineConfig
    from tests.app.conftest import TINY_ENGINE

    app = build(str(data_dir), default_model=str(tiny_models["qwen3"].gguf_path),
                engine=EngineConfig(**TINY_ENGINE), theme="light", show=False, **kwargs)
    qtbot.addWidget(app.window)
    app.window.show()
    qtbot.waitUntil(lambda: app.models.model_id("default") is not None, timeout=TURN_TIMEOUT_MS)
    return app


def hold_engine(app, seconds: float) -> None:
    """Keeps the engine thread busy for `seconds` (turns submitted meanwhile stay live), returning once it holds."""
    import threading
    import time

    held = threading.Event()
    engine = app.bridge.engine
    threading.Thread(target=lambda: engine.call(lambda _e: (held.set(), time.sleep(seconds))), daemon=True).start()
    assert held.wait(10), "the engine thread never ran the hold"


def chat_service(store):
    """The real chat service over `store`, its engine's and models' signals never firing (a sidebar's tests)."""
    import types

    from app.core.signals import BoundSignal
    from app.qt.chats import QtChatService

    bridge = types.SimpleNamespace(**{name: BoundSignal() for name in (
        "turn_started", "turn_queued", "text_arrived", "turn_finished", "turn_failed", "context_usage")})
    return QtChatService(store, bridge, types.SimpleNamespace(loaded=BoundSignal(), failed=BoundSignal(),
                                                              ensure=lambda *_: None))
