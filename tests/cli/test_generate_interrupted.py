"""Ctrl-C while `parley generate` answers: each prompt's text so far is reported, cut "cancelled", and the exit status
is 130. A batch (or --json) prints its answers at the end only: the interrupted run printed nothing, its text lost."""
from __future__ import annotations

import json

import pytest

from cli.engine_cli import EngineCLI
from cli.main import main


@pytest.fixture
def ctrl_c_after_tokens(monkeypatch):
    """The first run of the prompts raises KeyboardInterrupt (as Ctrl-C does) once 6 tokens have come."""
    real, calls = EngineCLI.run, []

    def run(self, turns, on_text=None):
        calls.append(turns)
        if len(calls) > 1:
            return real(self, turns, on_text)

        def tick(turn, text):
            if on_text:
                on_text(turn, text)
            if sum(map(len, self.tokens.values())) >= 6:
                raise KeyboardInterrupt
        return real(self, turns, tick)
    monkeypatch.setattr(EngineCLI, "run", run)


def _generate(tiny_models, tmp_path, *extra: str) -> int:
    return main(["--data-dir", str(tmp_path), "generate", "--model", str(tiny_models["qwen3"].gguf_path),
                 "--max-tokens", "200", "--speculative", "off", "--temperature", "1", "--seed", "5", "--prompt", "a",
                 *extra])


def test_an_interrupted_batch_reports_what_each_prompt_wrote(tiny_models, tmp_path, capsys, ctrl_c_after_tokens):
    assert _generate(tiny_models, tmp_path, "--prompt", "b", "--json") == 130
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    answers, load = lines[:-1], lines[-1]
    assert [a["prompt"] for a in answers] == [0, 1] and "load_s" in load
    assert all(a["reason"] == "cancelled" and a["completion_tokens"] < 200 for a in answers), answers
    assert sum(a["completion_tokens"] for a in answers) >= 6


def test_an_interrupted_stream_ends_its_line_and_exits_130(tiny_models, tmp_path, capsys, ctrl_c_after_tokens):
    assert _generate(tiny_models, tmp_path) == 130
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.strip()
