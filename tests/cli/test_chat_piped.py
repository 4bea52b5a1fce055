"""`parley chat` with its lines piped in (a script of questions): stdout holds the answers, not the prompts."""
from __future__ import annotations

import io

from cli.main import main


def test_piped_lines_get_answers_without_prompts(tiny_models, tmp_path, capsys, monkeypatch):
    """Each answer came after a "> " that no one typed at, and the output ended in a last "> " and a line break:
    'printf "q1\\nq2\\n" | parley chat > answers.txt' wrote '> a1\\n> a2\\n> \\n'."""
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\nBye\n"))
    args = ["--data-dir", str(tmp_path), "chat", "--model", str(tiny_models["qwen3"].gguf_path), "--max-tokens", "2"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert err.count("[2 tokens") == 2  # two answers
    assert "> " not in out
    assert out.endswith("\n")  # the last answer's line ended


def test_a_blank_line_does_not_end_the_chat_and_bye_does(tiny_models, tmp_path, capsys, monkeypatch):
    """An empty line ended the chat and threw its conversation away: an Enter pressed twice lost it."""
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n\n   \nAgain\n/bye\nNever sent\n"))
    args = ["--data-dir", str(tmp_path), "chat", "--model", str(tiny_models["qwen3"].gguf_path), "--max-tokens", "2"]
    assert main(args) == 0
    assert capsys.readouterr().err.count("[2 tokens") == 2  # "Hi" and "Again" answered; nothing after /bye
