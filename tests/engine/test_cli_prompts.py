"""`parley generate`'s prompts: from --prompt, --prompt-file and a piped stdin, and a batch where one is refused."""
import io
import json

import pytest

from cli.main import main


def _generate(tiny_models, tmp_path, *extra: str) -> int:
    return main(["--data-dir", str(tmp_path), "generate", "--model", str(tiny_models["qwen3"].gguf_path),
                 "--max-tokens", "3", "--speculative", "off", *extra])


def test_one_refused_prompt_of_a_batch_loses_none_of_the_others(tiny_models, tmp_path, capsys):
    too_long = "word " * 700  # the tiny model's context is 512
    code = _generate(tiny_models, tmp_path, "--json", "--prompt", "Hi", "--prompt", too_long, "--prompt", "Bye")
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 2
    assert [line.get("prompt") for line in lines[:3]] == [0, 1, 2]
    assert lines[0]["completion_tokens"] == 3 and lines[2]["completion_tokens"] == 3
    assert "context" in lines[1]["error"]
    assert "load_s" in lines[3]
    assert err.startswith("parley: prompt 1: ") and "Traceback" not in err


def test_a_refused_prompt_in_plain_text_names_its_index_and_the_rest_print(tiny_models, tmp_path, capsys):
    code = _generate(tiny_models, tmp_path, "--prompt", "word " * 700, "--prompt", "Bye")
    out, err = capsys.readouterr()
    assert code == 2
    assert "--- prompt 1 (" in out and "--- prompt 0" not in out
    assert "parley: prompt 0: " in err


def test_prompts_come_from_files_and_options_in_their_order(tiny_models, tmp_path, capsys):
    first = tmp_path / "first.txt"
    first.write_text("A long question\nover two lines\n", encoding="utf-8")
    code = _generate(tiny_models, tmp_path, "--json", "--raw", "--prompt-file", str(first), "--prompt", "Hi")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    alone = _generate(tiny_models, tmp_path, "--json", "--raw", "--prompt", "A long question\nover two lines")
    assert alone == 0
    again = json.loads(capsys.readouterr().out.splitlines()[0])
    assert lines[0]["prompt_tokens"] == again["prompt_tokens"]  # the file's last line break is not the prompt's
    assert lines[0]["token_ids"] == again["token_ids"]
    assert lines[1]["prompt"] == 1


def test_a_piped_stdin_is_the_prompt(tiny_models, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2+2?\n"))
    code = _generate(tiny_models, tmp_path, "--json")
    piped = json.loads(capsys.readouterr().out.splitlines()[0])
    assert code == 0
    assert _generate(tiny_models, tmp_path, "--json", "--prompt", "What is 2+2?") == 0
    assert piped["token_ids"] == json.loads(capsys.readouterr().out.splitlines()[0])["token_ids"]


@pytest.mark.parametrize("stdin, args, words", [
    ("", [], "stdin was empty"),
    ("x", ["--prompt-file", "-", "--prompt-file", "-"], "only once"),
    ("x", ["--prompt-file", "/nonexistent/p.txt"], "No such prompt file"),
    ("x", ["--prompt-file", "/dev/null"], "The prompt file /dev/null is empty."),  # it answered a prompt of nothing
    (" \n", ["--prompt", "Hi", "--prompt-file", "-"], "The prompt file (stdin) is empty."),
])
def test_no_usable_prompt_is_one_line_before_the_model_loads(tiny_models, tmp_path, capsys, monkeypatch,
                                                              stdin, args, words):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(["--data-dir", str(tmp_path), "generate", "--model", str(tmp_path / "absent.gguf"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert words in err and err.count("\n") == 1


def test_a_blank_prompt_file_path_is_refused_as_a_flag(capsys):
    """It was read as the working folder: 'Could not read the prompt file : Is a directory.'"""
    with pytest.raises(SystemExit) as stop:
        main(["generate", "--prompt-file", ""])
    assert stop.value.code == 2 and "argument --prompt-file: a file's path, or '-' for stdin, not ''" in \
        capsys.readouterr().err


def test_a_prompt_file_not_utf8_is_named(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    assert main(["--data-dir", str(tmp_path), "generate", "--prompt-file", str(bad)]) == 2
    assert "latin1.txt is not UTF-8" in capsys.readouterr().err
