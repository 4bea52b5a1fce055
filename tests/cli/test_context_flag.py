"""`parley generate --context` and `parley chat --context`: a session's tokens, as `parley serve --context` sets them.
Without it, a prompt over 8,192 tokens could not run on a model that holds 32,768, and the refusal said only
'Shorten it.'"""
from __future__ import annotations

import io
import json
import re

from cli.main import main

PROMPT = "word " * 30  # ~100 tokens of the tiny model


def _generate(tiny_models, tmp_path, *extra: str) -> int:
    return main(["--data-dir", str(tmp_path), "generate", "--model", str(tiny_models["qwen3"].gguf_path),
                 "--max-tokens", "2", "--speculative", "off", "--json", "--prompt", PROMPT, *extra])


def test_context_gives_a_prompt_room_and_its_refusal_names_the_flag(tiny_models, tmp_path, capsys):
    assert _generate(tiny_models, tmp_path, "--context", "64") == 2
    err = capsys.readouterr().err
    assert err.startswith("parley: The message needs ") and err.endswith(
        " Or raise --context (64 now), up to the model's own.\n")
    assert _generate(tiny_models, tmp_path, "--context", "256") == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["completion_tokens"] == 2


def test_a_context_the_model_caps_says_nothing_of_the_flag(tiny_models, tmp_path, capsys):
    """The tiny model holds 512 tokens: --context 100000 gives it no more, so the refusal does not offer it."""
    assert _generate(tiny_models, tmp_path, "--context", "100000", "--prompt", "word " * 700) == 2
    refusal = [line for line in capsys.readouterr().err.splitlines() if "prompt 1:" in line]
    assert "The message needs" in refusal[0] and "--context" not in refusal[0]


def test_chat_reads_context(tiny_models, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(PROMPT + "\n"))
    assert main(["--data-dir", str(tmp_path), "chat", "--model", str(tiny_models["qwen3"].gguf_path),
                 "--max-tokens", "2", "--context", "64"]) == 0
    assert "Or raise --context (64 now)" in capsys.readouterr().err


def test_a_context_above_the_model_s_own_is_said_once_by_generate_chat_and_serve(tiny_models, tmp_path, capsys,
                                                                                  monkeypatch):
    """--context 100000 on a model of 512 tokens was capped without a word (serve's 'context 512' alone showed it).
    Left at its default (8,192, above 512 too) nothing is said: the user asked for nothing."""
    import server.run

    class Run:
        def run(self, sockets):
            pass

    monkeypatch.setattr(server.run, "make_server", lambda *args, **kwargs: Run())
    gguf = str(tiny_models["qwen3"].gguf_path)
    commands = (["generate", "--prompt", "hi", "--max-tokens", "1"], ["chat"], ["serve", "--port", "0"])
    for command in commands:
        for context, said in ((["--context", "100000"], 1), ([], 0)):
            monkeypatch.setattr("sys.stdin", io.StringIO("/bye\n"))
            assert main(["--data-dir", str(tmp_path), *command, "--model", gguf, "--speculative", "off", *context]) == 0
            lines = [line for line in capsys.readouterr().err.splitlines() if "--context" in line]
            assert len(lines) == said and all(re.fullmatch(r"parley: --context 100,000 is more than \S+ holds: its "
                                                           r"sessions get its own 512 tokens", line) for line in lines)
