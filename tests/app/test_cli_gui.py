"""`parley` with no subcommand is the GUI; `--self-test` runs it headless; `parley chat` stays the terminal chat."""
from __future__ import annotations

from cli import main as cli
from cli import terminal


def test_no_subcommand_launches_the_gui(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("app.qt.main.run_gui", lambda data_dir, theme: calls.append(("gui", data_dir, theme)) or 0)
    monkeypatch.setattr("app.qt.self_test.run", lambda data_dir: calls.append(("self-test", data_dir)) or 0)
    assert cli.main(["--data-dir", str(tmp_path)]) == 0
    assert cli.main(["--data-dir", str(tmp_path), "--self-test"]) == 0
    assert cli.main(["--theme", "dark"]) == 0
    assert calls == [("gui", str(tmp_path), None), ("self-test", str(tmp_path)), ("gui", None, "dark")]
    args = cli.build_parser().parse_args(["chat", "--max-tokens", "5"])
    assert args.func is terminal.chat
