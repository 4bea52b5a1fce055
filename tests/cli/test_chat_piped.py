"""`parley chat` with its lines piped in (a script of questions): stdout holds the answers, not the prompts."""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from cli.main import main
from cli.prompts import BYTES_PER_TOKEN
from tests.cli.test_prompt_files import _limited_memory


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


def test_a_piped_line_longer_than_a_message_could_be_ends_the_chat_in_one_line(tiny_models, tmp_path, capsys,
                                                                               monkeypatch):
    """input() read a piped line whole: 400 MB took 1.5 GB before the engine refused it, and /dev/zero grew without
    end. A line at the bound is read (the engine then refuses it for its model's context, and the chat goes on)."""
    most = 64 * BYTES_PER_TOKEN
    monkeypatch.setattr("sys.stdin", io.StringIO(f"Hi\n{'x' * most}\nAgain\n{'y' * (most + 1)}\nNever sent\n"))
    args = ["--data-dir", str(tmp_path), "chat", "--model", str(tiny_models["qwen3"].gguf_path), "--max-tokens", "2",
            "--context", "64"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("[2 tokens") == 2 and "The last message needs at least" in err  # Hi, Again; the line at the bound
    assert err.endswith(f"parley: A line on stdin is over {most:,} characters, more than a prompt of 64 tokens can be "
                        f"({BYTES_PER_TOKEN} characters a token at most): shorten it, or raise --context (64 now).\n")


def test_dev_zero_on_a_chats_stdin_is_refused_not_read_forever():
    code = "from cli.prompts import *; read_line(PromptBound(8192))"
    with open("/dev/zero") as zero:
        done = subprocess.run([sys.executable, "-c", code], stdin=zero, capture_output=True, text=True, timeout=60,
                              cwd=Path(__file__).parents[2], preexec_fn=_limited_memory)
    assert "ParleyError: A line on stdin is over 4,194,304 characters" in done.stderr, done.stderr[-500:]
