"""Makes the README screenshots offscreen on the embedded model: python docs/screenshots.py [--data-dir DIR]

main.png (three chats, two streaming), compare.png (two columns), settings.png, dark.png; at 1280×800:
empty-1280x800.png (a first start: the empty chat) and compare4-1280x800.png (four columns, tiled 2×2).
`set`: at 1280×800 and 1024×700 each, empty, live (three chats streaming, the live panel open), compare4,
diff (two columns' answers compared), dark and models (the model list): NAME-WxH.png.
--shots picks some: python docs/screenshots.py --shots empty,compare4
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gui_harness import fresh_data_dir, pump_until  # noqa: E402

OUT = Path(__file__).resolve().parent / "screenshots"
SIZES = [(1280, 800), (1024, 700)]  # the set's window sizes (issue 22): a laptop and a small screen


def settle(seconds: float = 0.3) -> None:
    pump_until(lambda: False, seconds, nap=0.005)


def ask(app, conv: int, prompt: str, **settings) -> None:
    app.window.apply_settings(conv, app.store.get(conv).settings.copy(**settings))
    app.window.open_chat(conv)
    app.window.chat.send(prompt)


def main_window(app) -> list[int]:
    svc, w = app.service, app.window
    first = w.current()
    ask(app, first, "Write a Python function that reverses a string.\n\n```python", max_tokens=60, temperature=0.0)
    pump_until(lambda: not svc.busy(first), 600)
    streaming = [w.new_chat(), w.new_chat()]
    ask(app, streaming[0], "Tell me a story about a lighthouse keeper.", max_tokens=400, temperature=0.7, seed=7)
    ask(app, streaming[1], "What are good habits for learning a language?", max_tokens=400, temperature=0.7, seed=5)
    pump_until(lambda: all(len(svc.store.path(c)[-1].content) > 160 for c in streaming), 600)
    w.open_chat(streaming[0])
    settle()
    w.grab().save(str(OUT / "main.png"))
    return [first, *streaming]


def compare(app) -> None:
    _compare_shot(app, [(0.0, None), (1.0, 11)], 48, "Give me three tips for a rainy weekend.", "compare.png")


def empty_state(app) -> None:
    w = app.window
    w.resize(1280, 800)
    settle()
    w.grab().save(str(OUT / "empty-1280x800.png"))


def compare4(app) -> None:
    app.window.resize(1280, 800)
    app.window.show_compare()
    app.window.compare.set_columns(4)
    _compare_shot(app, [(0.0, None), (0.7, 3), (1.0, 11), (0.7, 5)], 40, "The best way to spend a rainy weekend is",
                  "compare4-1280x800.png")


def _compare_shot(app, columns: list[tuple[float, int | None]], max_tokens: int, prompt: str, name: str) -> None:
    """One prompt sent to the compare view's columns, each with its (temperature, seed); saved when all finish."""
    svc, w = app.service, app.window
    w.show_compare()
    view = w.compare
    for column, (temp, seed) in zip(view.columns, columns):
        s = svc.store.get(column.conv_id).settings
        svc.set_settings(column.conv_id, s.copy(temperature=temp, seed=seed, max_tokens=max_tokens))
    view.send(prompt)
    pump_until(lambda: not view.busy(), 600)
    settle()
    w.grab().save(str(OUT / name))


def sized_set(app, width: int, height: int) -> None:
    """The issue-22 set at one window size, on a fresh data dir's first chat."""
    svc, w = app.service, app.window
    tag = f"{width}x{height}"
    w.set_theme("light")
    w.resize(width, height)
    w.open_chat(w.new_chat())
    settle()
    w.grab().save(str(OUT / f"empty-{tag}.png"))
    chats = [w.new_chat() for _ in range(3)]
    for conv, (prompt, seed) in zip(chats, [("Tell me a story about a lighthouse keeper.", 7),
                                            ("What are good habits for learning a language?", 5),
                                            ("Once upon a time, in a village by the sea, there lived", 3)]):
        ask(app, conv, prompt, max_tokens=300, temperature=0.7, seed=seed)
    w.live_panel.show()
    pump_until(lambda: all(len(svc.store.path(c)[-1].content) > 80 for c in chats), 600)
    w.open_chat(chats[0])
    settle()
    w.grab().save(str(OUT / f"live-{tag}.png"))
    for c in chats:
        svc.stop(c)
    pump_until(lambda: not any(svc.busy(c) for c in chats), 60)
    w.live_panel.hide()
    w.show_compare()
    w.compare.set_columns(4)
    _compare_shot(app, [(0.0, None), (0.7, 3), (1.0, 11), (0.7, 5)], 40, "The best way to spend a rainy weekend is",
                  f"compare4-{tag}.png")
    dialog = w.compare.show_diff()
    settle()
    dialog.grab().save(str(OUT / f"diff-{tag}.png"))
    dialog.close()
    w.set_theme("dark")
    w.open_chat(chats[1])
    settle()
    w.grab().save(str(OUT / f"dark-{tag}.png"))
    w.set_theme("light")
    models = w.show_models()
    settle()
    models.grab().save(str(OUT / f"models-{tag}.png"))
    models.close()


def settings(app) -> None:
    from app.qt.settings_dialog import SettingsDialog

    w = app.window
    dialog = SettingsDialog(app.models.registry, app.store.get(w.current()).settings, parent=w)
    dialog.form.system.setPlainText("You are a concise assistant.")
    dialog.show()
    settle()
    dialog.grab().save(str(OUT / "settings.png"))
    dialog.close()


def dark(app, conv: int) -> None:
    w = app.window
    w.set_theme("dark")
    w.open_chat(conv)
    settle()
    w.grab().save(str(OUT / "dark.png"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model-cache", default=str(Path(tempfile.gettempdir()) / "parley-bench"),
                   help="keeps the assembled and converted model between runs; chats start empty every run")
    p.add_argument("--shots", default="main,settings,compare,dark,empty,compare4")
    args = p.parse_args()
    shots = set(args.shots.split(","))
    from app.qt.main import build, qt_app

    qt_app()
    app = build(fresh_data_dir(args.model_cache), theme="light")
    app.window.resize(1280, 820)
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        if not pump_until(lambda: app.models.model_id("default") is not None, 300):
            print("the embedded model did not load", file=sys.stderr)
            return 1
        if "empty" in shots:
            empty_state(app)
        chats = main_window(app) if "main" in shots else [app.window.current()]
        for c in chats:
            app.service.stop(c)
        pump_until(lambda: not any(app.service.busy(c) for c in chats), 60)
        for name, shot in [("settings", settings), ("compare", compare), ("compare4", compare4)]:
            if name in shots:
                shot(app)
        if "dark" in shots:
            dark(app, chats[0])
        if "set" in shots:
            for width, height in SIZES:
                sized_set(app, width, height)
    finally:
        app.close()
    print("\n".join(str(p) for p in sorted(OUT.glob("*.png"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
