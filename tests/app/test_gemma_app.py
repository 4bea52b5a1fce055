"""The app on the embedded Gemma 3 270M: the self-test's two chats stream at once and both answer."""
from __future__ import annotations

import asyncio

import pytest


@pytest.mark.slow
def test_two_chats_on_the_embedded_model(qtbot, qapp, tmp_path):
    import qasync

    from app.qt.main import build
    from app.qt.self_test import check

    app = build(str(tmp_path / "data"), theme="light", show=False)
    qtbot.addWidget(app.window)
    loop = qasync.QEventLoop(qapp, already_running=False)
    try:
        result = loop.run_until_complete(check(app, timeout=300))
    finally:
        app.bridge.shutdown()
        loop.close()
    assert result["ok"] and all(a.strip() for a in result["answers"])
    assert app.models.state("default").name  # the embedded model's name from its GGUF


@pytest.mark.slow
def test_the_self_test_says_at_once_why_the_model_did_not_load(qtbot, qapp, tmp_path, monkeypatch):
    """A bundle missing an architecture module (PyInstaller cannot see imports by name) failed after 240 s with
    'timed out waiting for the model'; the load's own error comes back as soon as it fails."""
    import sys
    import time

    import qasync

    from app.qt.main import build
    from app.qt.self_test import check

    monkeypatch.setitem(sys.modules, "engine.models.gemma3", None)  # its import fails, as in such a bundle
    app = build(str(tmp_path / "data"), theme="light", show=False)
    qtbot.addWidget(app.window)
    loop = qasync.QEventLoop(qapp, already_running=False)
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="did not load.*gemma3"):
            loop.run_until_complete(check(app, timeout=120))
    finally:
        app.bridge.shutdown()
        loop.close()
    assert time.monotonic() - started < 60
