"""Ctrl-C in the terminal that ran `make run` (or `parley`) closes the window as its close button does."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# the real entry point (cli.main.main, no subcommand) on a tiny model instead of the embedded one
CHILD = """
import sys
from functools import partial
import app.qt.main as gui
from PySide6.QtCore import QTimer
from cli.main import main
gui.build = partial(gui.build, default_model=sys.argv[1])
gui.qt_app()
QTimer.singleShot(0, lambda: print("window up", flush=True))  # runs once the app's loop does
sys.exit(main(["--data-dir", sys.argv[2]]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="no SIGINT to send there")
def test_ctrl_c_closes_the_window_and_exits_130(tiny_models, tmp_path):
    """Qt's loop runs Python only inside callbacks: the KeyboardInterrupt went off in the next one (a traceback from
    app/qt/drops.py's eventFilter) and the window stayed open, a first run building its kernels on."""
    data = tmp_path / "data"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PARLEY_CPU_KERNEL": "0"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tiny_models["qwen3"].gguf_path), str(data)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=Path(__file__).parents[2])
    try:
        assert child.stdout.readline().strip() == "window up"
        child.send_signal(signal.SIGINT)
        code = child.wait(timeout=30)
    finally:
        child.kill()
        out, err = child.communicate()
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "geometry" in json.loads((data / "settings.json").read_text())["window"]  # closed as by its button
