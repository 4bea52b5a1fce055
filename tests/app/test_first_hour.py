"""What a new user's first hour found (sweep AL), each as the user meets it: keys, focus and what stays on screen."""
from __future__ import annotations

from tests.app.helpers import start_app


def test_a_restart_puts_the_cursor_in_the_message_box(qtbot, qapp, tiny_models, tmp_path):
    """The chat open at close comes back with the box focused: the New chat button had the focus, so what the user
    typed went nowhere and a Space made another chat."""
    first = start_app(qtbot, tmp_path / "data", tiny_models)
    first.store.add_message(first.window.current(), None, "user", "kept")
    first.close()
    second = start_app(qtbot, tmp_path / "data", tiny_models)
    try:
        assert second.window.focusWidget() is second.window.chat.composer.edit
    finally:
        second.close()
