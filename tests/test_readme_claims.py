"""What README.md tells a new user, checked against the code: its benchmark commands start, its list of the
server's refused request fields names every field the server refuses, its options belong to the commands it says."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from server.protocol import APIError, parse_chat, parse_completion

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# a value of each field that asks for something the server does not do, and the endpoint it is sent to
REFUSED = [
    ("tools", [TOOL], "chat"), ("functions", [TOOL["function"]], "chat"),
    ("tool_choice", "required", "chat"), ("function_call", {"name": "f"}, "chat"),
    ("response_format", {"type": "xml"}, "chat"),
    ("echo", True, "chat"), ("suffix", " end", "chat"), ("best_of", 2, "chat"),
]


def _bench_commands() -> list[list[str]]:
    """The README's benchmark lines as argv after the interpreter: ['bench/x.py'] or ['-m', 'bench.x']."""
    block = README.split("## Benchmarks", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.strip().splitlines():
        words = line.split("#", 1)[0].split()
        assert words and words[0].endswith("python"), line
        commands.append([w for w in words[1:] if w != "--check"])
    return commands


@pytest.mark.parametrize("argv", _bench_commands(), ids=lambda a: a[-1])
def test_readme_bench_commands_start(argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user runs it: from the checkout, no path set
    run = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def _refusal_sentence() -> str:
    text = " ".join(README.split())
    match = re.search(r"Not supported \(answered with a 400[^:]*:(.*?)\.(?: |$)", text)
    assert match, "README no longer lists what the server refuses"
    return match.group(1)


@pytest.mark.parametrize("field,value,endpoint", REFUSED, ids=[r[0] for r in REFUSED])
def test_readme_names_every_refused_field(field: str, value, endpoint: str) -> None:
    body = {"messages": MESSAGES} if endpoint == "chat" else {"prompt": "hi"}
    parse = parse_chat if endpoint == "chat" else parse_completion
    with pytest.raises(APIError) as refused:
        parse({**body, field: value}, 8192)
    assert refused.value.status == 400 and refused.value.param == field
    assert f"`{field}`" in _refusal_sentence(), f"README's list of 400s leaves out `{field}`"


def test_readme_does_not_promise_tools_served_as_text() -> None:
    """A request carrying tools is refused whatever its tool_choice: the README must not say 'auto' serves it."""
    with pytest.raises(APIError) as refused:
        parse_chat({"messages": MESSAGES, "tools": [TOOL], "tool_choice": "auto"}, 8192)
    assert refused.value.param == "tools"
    assert "served as plain text" not in _refusal_sentence()


def _subcommand_flags() -> dict[str, set[str]]:
    from cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: set(p._option_string_actions) for name, p in sub.choices.items()}


def test_readme_options_belong_to_the_commands_it_names() -> None:
    """The README's 'Options:' list: engine options every command takes, then those of `generate` and `chat` only."""
    text = " ".join(README.split())
    options = text.split("Options: ", 1)[1].split(" Data go under", 1)[0]
    shared, marker, terminal = options.partition("for `generate` and `chat`")
    assert marker, "README no longer says which options only generate and chat take"
    flags = _subcommand_flags()
    for flag in re.findall(r"`(--[a-z-]+)", shared):
        assert all(flag in flags[c] for c in ("generate", "chat", "serve")), flag
    for flag in re.findall(r"`(--[a-z-]+)", terminal):
        assert flag in flags["generate"] and flag in flags["chat"] and flag not in flags["serve"], flag


def test_readme_says_remote_alone_loads_no_local_model() -> None:
    """`serve --remote URL` without --model serves the remote model only: the README must not promise the local one."""
    from cli.main import build_parser

    assert build_parser().parse_args(["serve", "--remote", "http://gpu-box:8000/v1#m"]).model is None
    text = " ".join(README.split())
    remote = text.split("`parley serve --remote ", 1)[1].split(". ", 1)[0]
    assert "with `--remote` alone, no local model loads" in remote


def test_readme_names_what_make_test_builds() -> None:
    """The test extras build llama.cpp from source (the Makefile sets its CMAKE_ARGS): a compiler is needed."""
    extras = (ROOT / "pyproject.toml").read_text(encoding="utf-8").split("test = [", 1)[1].split("\n]", 1)[0]
    assert "llama-cpp-python" in extras and "CMAKE_ARGS" in (ROOT / "Makefile").read_text(encoding="utf-8")
    needs = " ".join(README.split()).split("Both commands need", 1)[1].split(". ", 1)[0]
    assert "compiler" in needs, "README says Python and make suffice for `make test`"


def _layout_row(folder: str) -> str:
    return next(line for line in README.splitlines() if line.startswith(f"| `{folder}/` |"))


def test_readme_layout_names_the_cpu_kernels_and_gpu_tests() -> None:
    """The Layout table's rows for kernels/ and tests/ name what is there: the C kernels' folder, the gpu marker."""
    assert (ROOT / "kernels" / "cpu").is_dir() and "`kernels/cpu/`" in _layout_row("kernels")
    markers = (ROOT / "pyproject.toml").read_text(encoding="utf-8").split("markers = [", 1)[1].split("\n]", 1)[0]
    assert '"gpu:' in markers and "test-gpu:" in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "`gpu`" in _layout_row("tests") and "`make test-gpu`" in _layout_row("tests")


def test_architecture_lists_the_import_contracts_the_test_checks() -> None:
    """docs/ARCHITECTURE.md says its rules are each checked by tests/test_import_contracts.py: one bullet a contract."""
    from tests.test_import_contracts import CONTRACTS

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rules = text.split("tests/test_import_contracts.py", 1)[1].split("\n\n", 1)[1].split("\n\n", 1)[0]
    bullets = [line for line in rules.splitlines() if line.startswith("- ")]
    assert sorted(b[2:].split(":")[0].rstrip(".") for b in bullets) == sorted(c.name for c in CONTRACTS)


@pytest.mark.parametrize("flag,value,accepted", [("--min-p", "1.5", "1"), ("--top-p", "-0.5", "0"),
                                                 ("--top-k", "-2", "-1"), ("--seed", "18446744073709551616", "-1")])
def test_a_refused_sampling_flag_states_the_range_the_flag_accepts(flag, value, accepted, capsys) -> None:
    """The README's --top-p / --top-k / --min-p / --seed take values the engine's checks refuse (greedy, off, random):
    a value out of range names the flag and the command line's range, not the engine's (which would rule out those)."""
    from cli.main import build_parser
    from cli.options import sampling_params

    sampling_params(build_parser().parse_args(["generate", flag, accepted]))  # the edge the help promises is taken
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", flag, value])
    error = capsys.readouterr().err.splitlines()[-1]
    assert f"argument {flag}:" in error and accepted in error, error


def test_readme_lists_every_shortcut_of_the_window() -> None:
    """Each key the window's menu actions bind (app/qt/window.py) is named in the README's section on the app."""
    window = (ROOT / "app" / "qt" / "window.py").read_text(encoding="utf-8")
    keys = set(re.findall(r'"(Ctrl\+[^"]+)"', window))
    assert {"Ctrl+N", "Ctrl+K"} <= keys  # the scan still finds the bindings
    shortcuts = README.split("## The app", 1)[1].split("## Command line", 1)[0]
    assert sorted(k for k in keys if k not in shortcuts) == []
