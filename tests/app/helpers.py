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


def engine_messages(app, conv_id: int) -> list[dict]:
    sid = app.service.live(conv_id).session_id
    return app.bridge.engine.call(lambda eng: [dict(m) for m in eng._sessions[sid].messages])


def engine_session(app, conv_id: int):
    sid = app.service.live(conv_id).session_id
    return app.bridge.engine.call(lambda eng: eng._sessions[sid])
