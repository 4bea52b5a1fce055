"""`parley` with no subcommand is the GUI; `--self-test` runs it headless; `parley chat` stays the terminal chat."""
from __future__ import annotations

from cli import main as cli
from cli import terminal


def test_no_subcommand_launches_the_gui(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("app.qt.main.run_gui", lambda data_dir, theme: calls.append(("gui", data_dir, theme)) or 0)
    monkeypatch.setattr("app.qt.self_test.run", lambda data_dir, theme: calls.append(("self-test", data_dir, theme))
                        or 0)
    assert cli.main(["--data-dir", str(tmp_path)]) == 0
    assert cli.main(["--data-dir", str(tmp_path), "--self-test"]) == 0
    assert cli.main(["--theme", "dark"]) == 0
    assert cli.main(["--self-test", "--theme", "light"]) == 0
    assert calls == [("gui", str(tmp_path), None), ("self-test", str(tmp_path), None), ("gui", None, "dark"),
                     ("self-test", None, "light")]
    args = cli.build_parser().parse_args(["chat", "--max-tokens", "5"])
    assert args.func is terminal.chat


def test_sampling_flags_reach_the_sampler():
    from cli.options import sampling_params

    args = cli.build_parser().parse_args(["generate", "--prompt", "x", "--temperature", "0.7", "--top-k", "40",
                                          "--min-p", "0.05", "--repeat-penalty", "1.1", "--presence-penalty", "0.2",
                                          "--frequency-penalty", "0.1", "--repeat-last-n", "-1", "--seed", "3"])
    p = sampling_params(args)
    assert (p.temperature, p.top_k, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty,
            p.repeat_last_n, p.seed) == (0.7, 40, 0.05, 1.1, 0.2, 0.1, -1, 3)
    plain = sampling_params(cli.build_parser().parse_args(["chat"]))
    assert plain.repetition_penalty == 1.0 and plain.repeat_last_n == 64  # off, llama.cpp's window when turned on


def test_the_cli_reads_a_seed_as_the_server_does(capsys):
    """`--seed -5` was refused while the server took any int64 and wrapped it: both read one rule now."""
    import pytest

    from cli.options import sampling_params
    from server.protocol import APIError, sampling

    def cli_seed(value: int):
        return sampling_params(cli.build_parser().parse_args(["generate", "--seed", str(value)])).seed

    for value in (-5, -1, 0, 7, -(2**63), 2**64 - 1):
        assert cli_seed(value) == sampling({"seed": value}, 4096).seed, value
    assert cli_seed(-5) == 2**64 - 5 and cli_seed(-1) is None
    for value in (2**64, -(2**63) - 1):
        with pytest.raises(APIError):
            sampling({"seed": value}, 4096)
        with pytest.raises(SystemExit):
            cli_seed(value)
    assert "not '18446744073709551616'" in capsys.readouterr().err
    generate = cli.build_parser()._subparsers._group_actions[0].choices["generate"]
    help_text = " ".join(generate.format_help().split())  # as wrapped to any width
    assert "-2**63" in help_text and "the server takes the same" in help_text


def test_the_load_line_gives_both_sizes_in_one_unit():
    """resident_mb was MiB beside weights_mb in MB: the embedded model's 253.0 MB read as 241.3 MiB beside it."""
    from cli.terminal import _load_line

    line = _load_line({"load_s": 1.0, "weights_mb": 253.0, "quantization": "Q4_K_M"})
    assert line["weights_mib"] == 241.3 and line["weights_mb"] == 253.0  # the old field kept, as it was
    assert line["resident_mib"] == line["resident_mb"] > 0


def test_version_flag(capsys):
    import pytest

    from app.core.version import parley_version

    for argv in (["--version"], ["generate", "--version"], ["chat", "--version"], ["serve", "--version"]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 0
        # the packaged app's --version (packaging/parley_main.py) and About name it so: 'parley 0.1.0' here was the odd one
        assert capsys.readouterr().out.strip() == f"Parley {parley_version()}", argv


def test_chat_ignores_what_is_typed_while_it_answers(monkeypatch, capsys, tiny_models):
    """Keys pressed during an answer are neither echoed into it nor sent as the next prompt."""
    import builtins
    import os
    import pty

    from cli.engine_cli import EngineCLI

    master, slave = pty.openpty()
    tty_in = os.fdopen(slave, "r", encoding="utf-8", buffering=1)
    monkeypatch.setattr("sys.stdin", tty_in)
    sent, real_run, real_input = [], EngineCLI.run, builtins.input

    def run(self, turns, on_text=None):
        os.write(master, b"typed meanwhile\n")  # the user types while the answer streams
        return real_run(self, turns, on_text)

    def submit_spy(self_engine_submit):
        def submit(sid, messages, *args, **kwargs):
            sent.append(messages[-1]["content"])
            return self_engine_submit(sid, messages, *args, **kwargs)
        return submit

    calls = []

    def fake_input(prompt=""):
        calls.append(prompt)
        os.write(master, b"hello\n" if len(calls) == 1 else b"/bye\n")  # a blank line no longer ends the chat
        return real_input(prompt)

    real_init = EngineCLI.__init__

    def init(self, config):
        real_init(self, config)
        self.engine.submit = submit_spy(self.engine.submit)

    monkeypatch.setattr(EngineCLI, "__init__", init)
    monkeypatch.setattr(EngineCLI, "run", run)
    monkeypatch.setattr(builtins, "input", fake_input)
    try:
        code = cli.main(["chat", "--model", str(tiny_models["qwen3"].gguf_path), "--max-tokens", "4",
                         "--device", "cpu"])
        echoed = _drain(master)
    finally:
        tty_in.close()
        os.close(master)
    assert code == 0
    assert sent == ["hello"], f"sent {sent}"
    assert "typed meanwhile" not in echoed and "typed meanwhile" not in capsys.readouterr().out


def _drain(fd: int) -> str:
    import os
    import select

    out = b""
    while select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out.decode("utf-8", "replace")


def test_chat_says_when_an_answer_was_cut_and_old_turns_left_out():
    """`parley chat` truncates a chat past its context and cuts answers at max tokens; its status line said neither."""
    from cli.terminal import _status_line
    from engine import events as ev

    stats = ev.TurnStats(prompt_tokens=90, prefilled_tokens=20, completion_tokens=4, ttft_s=0.1, tokens_per_s=12.5,
                         context_used=94, context_limit=256)
    done = ev.Finished(1, 1, "stop", "text", stats)
    assert _status_line(done, 0) == "[4 tokens, 12.5 tok/s, context 94/256]"
    cut = ev.Finished(1, 2, "length", "text", stats)
    assert _status_line(cut, 6) == "[4 tokens, 12.5 tok/s, context 94/256, cut at the max tokens, 6 oldest messages left out to fit]"
    full = ev.Finished(1, 3, "context_full", "text", stats)
    assert "the context is full" in _status_line(full, 1) and "1 oldest message left out" in _status_line(full, 1)


def test_a_blank_data_folder_is_refused_not_made_where_parley_runs(monkeypatch, tmp_path, capsys):
    """`--data-dir "$DIR"` with DIR unset fell back to the user's real data folder; PARLEY_HOME=" " (or --data-dir
    " ") made a folder named " " where the command ran and put a 253 MB copy of the model in it."""
    import pytest

    from cli.paths import Paths
    from engine.errors import ParleyError

    monkeypatch.chdir(tmp_path)
    for argv in (["--data-dir", ""], ["--data-dir", " "], ["generate", "--data-dir", "", "--prompt", "x"]):
        with pytest.raises(SystemExit) as stop:
            cli.build_parser().parse_args(argv)
        assert stop.value.code == 2 and "argument --data-dir: a folder to keep the data in, not" in capsys.readouterr().err
    monkeypatch.setenv("PARLEY_HOME", " \t")
    with pytest.raises(ParleyError):
        Paths.resolve()
    assert cli.main(["generate", "--prompt", "x"]) == 2
    assert capsys.readouterr().err == ("parley: PARLEY_HOME is blank (' \\t'): set it to the folder Parley keeps its data "
                                       "in, or unset it for the platform's user folders.\n")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("PARLEY_HOME", "")  # empty is unset, as a compose file's PARLEY_HOME= means
    assert Paths.resolve().data.name == "Parley"


def test_a_blank_model_is_refused_as_a_flag(capsys):
    """--model "" loaded the working folder ('. has no config.json: it is not a Hugging Face model folder.') after
    seconds of imports, and --draft-model "" was read as no draft model at all."""
    import pytest

    for argv in (["generate", "--model", ""], ["chat", "--model", " "], ["serve", "--model", ""],
                 ["generate", "--draft-model", ""]):
        with pytest.raises(SystemExit) as stop:
            cli.build_parser().parse_args(argv)
        flag = argv[1]
        assert stop.value.code == 2 and f"argument {flag}: 'default' (embedded Gemma 3 270M), a .gguf file or a HF " \
                                        "folder, not" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["serve", "--model", "a.gguf", "--model", "default"]).model == ["a.gguf",
                                                                                                       "default"]


def test_a_sampling_value_the_engine_refuses_names_its_flag():
    """--max-tokens 0 said 'Invalid sampling setting: max_tokens must be between 1 and 2147483647.': a field's name,
    not the flag, and not the value given."""
    import pytest

    from cli.options import sampling_params
    from engine.errors import ParleyError

    for argv, said in ((["--max-tokens", "0"], "argument --max-tokens: must be between 1 and 2147483647, not 0"),
                       (["--temperature", "nan"], "argument --temperature: must be a finite number, not nan"),
                       (["--repetition-penalty", "0"], "argument --repetition-penalty: must be between 0.01 and 100, "
                                                       "not 0.0"),
                       (["--repeat-last-n", "-2"], "argument --repeat-last-n: must be between -1 (the whole history) "
                                                   "and 2147483647, not -2")):
        for command in ("generate", "chat"):
            with pytest.raises(ParleyError) as refused:
                sampling_params(cli.build_parser().parse_args([command, *argv]))
            assert str(refused.value) == said


def test_thinking_with_raw_is_refused(capsys, tmp_path):
    """`parley generate --raw --thinking on` answered without a word: the switch is the chat template's, and --raw
    sends the text without one."""
    for value in ("on", "off"):
        assert cli.main(["generate", "--data-dir", str(tmp_path), "--model", str(tmp_path / "none.gguf"), "--raw",
                         "--thinking", value, "--prompt", "x"]) == 2
        assert capsys.readouterr().err == ("parley: argument --thinking: it switches a chat template's thinking; --raw "
                                           f"sends the text without one (leave out --thinking {value} or --raw)\n")


def test_the_apps_flags_with_a_subcommand_are_refused(capsys, tmp_path):
    """`parley --self-test serve` served and `parley --theme dark chat` chatted: the app's flag unread."""
    for argv in (["--self-test", "serve"], ["--theme", "dark", "chat"], ["--theme", "light", "generate"]):
        assert cli.main(["--data-dir", str(tmp_path), *argv, "--model", str(tmp_path / "none.gguf")]) == 2
        flag, command = argv[0], argv[-1]
        assert capsys.readouterr().err == (f"parley: argument {flag}: it is the app's (parley without a subcommand); "
                                           f"parley {command} does not read it\n")


def test_thinking_for_a_model_without_the_switch_is_said(tiny_models, tmp_path, capsys):
    """`parley generate --thinking off` on a model whose chat template has no thinking switch answered as it would
    have anyway, without a word."""
    argv = ["generate", "--data-dir", str(tmp_path), "--model", str(tiny_models["llama"].gguf_path), "--prompt", "x",
            "--max-tokens", "2", "--json"]
    assert cli.main([*argv, "--thinking", "off"]) == 0
    assert capsys.readouterr().err.endswith("parley: --thinking off does nothing here: llama's chat template has "
                                            "no thinking switch\n")
    assert cli.main(argv) == 0
    assert "--thinking" not in capsys.readouterr().err


def test_the_cpu_kernels_are_built_under_the_data_folder(monkeypatch, tmp_path, capsys):
    """--data-dir (or PARLEY_HOME) kept chats, models and converted weights in its folder, and the CPU library went to
    the platform's cache folder (~/.cache/Parley/kernels) all the same."""
    from kernels.cpu_native import kernel_dir

    missing = str(tmp_path / "none.gguf")
    for command in (["generate", "--prompt", "x"], ["serve"]):
        monkeypatch.delenv("PARLEY_KERNEL_CACHE", raising=False)
        assert cli.main(["--data-dir", str(tmp_path / "data"), *command, "--model", missing]) == 2
        assert kernel_dir() == tmp_path / "data" / "cache" / "kernels", command
    monkeypatch.setattr("app.qt.self_test.run", lambda data_dir, theme: 0)  # the app's start, short of its window
    monkeypatch.delenv("PARLEY_KERNEL_CACHE", raising=False)
    assert cli.main(["--data-dir", str(tmp_path / "app"), "--self-test"]) == 0
    assert kernel_dir() == tmp_path / "app" / "cache" / "kernels"
    monkeypatch.setenv("PARLEY_KERNEL_CACHE", str(tmp_path / "mine"))  # the user's own choice is kept
    cli.main(["--data-dir", str(tmp_path / "data"), "generate", "--prompt", "x", "--model", missing])
    assert kernel_dir() == tmp_path / "mine"
    assert "none.gguf" in capsys.readouterr().err
