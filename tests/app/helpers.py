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
