"""The terminal commands under locales that are not UTF-8: an answer the terminal's encoding cannot hold is written
escaped (it raised UnicodeEncodeError mid-answer), and a prompt typed as UTF-8 under an ASCII locale reaches the
model as typed, not as surrogate escapes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cli.terminal import typed

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "hi 東京 👋"


def _run(args: list[str], env: dict[str, str], tmp_path: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARLEY_HOME": str(tmp_path / "home"), **env}
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, input=stdin and stdin.encode(),
                          capture_output=True, timeout=120)


def test_text_the_terminal_cannot_encode_is_written_escaped(tmp_path):
    code = "from cli.main import _tolerant_streams; _tolerant_streams(); print('東京 👋')"
    for encoding in ("ascii", "latin-1"):
        proc = _run(["-c", code], {"PYTHONIOENCODING": encoding}, tmp_path)
        assert proc.returncode == 0, proc.stderr.decode()
        assert proc.stdout.decode("ascii").strip() == "\\u6771\\u4eac \\U0001f44b"


def test_typed_reads_undecoded_bytes_as_utf8():
    assert typed(PROMPT.encode().decode("ascii", "surrogateescape")) == PROMPT
    assert typed(PROMPT) == PROMPT
    assert typed(b"\xff ok".decode("ascii", "surrogateescape")) == "\ufffd ok"  # not UTF-8 either: one mark


def _prompt_tokens(tiny_models, tmp_path: Path, env: dict[str, str]) -> int:
    model = str(tiny_models["qwen3"].gguf_path)
    proc = _run(["-m", "cli.main", "generate", "--model", model, "--prompt", PROMPT, "--max-tokens", "2", "--json"],
                env, tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout.decode().splitlines()[0])["prompt_tokens"]


def test_a_prompt_under_an_ascii_locale_reaches_the_model_as_typed(tiny_models, tmp_path):
    ascii_locale = {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}  # argv arrives surrogate-escaped
    assert _prompt_tokens(tiny_models, tmp_path, ascii_locale) == _prompt_tokens(tiny_models, tmp_path, {"LC_ALL": "C.UTF-8"})



def test_a_path_naming_no_users_home_is_one_line(tmp_path):
    """~someone/ for a user this machine does not have: Path.expanduser raised RuntimeError, a traceback."""
    model, data = "~no-such-user-7/m.gguf", "~no-such-user-7/data"
    for args, path in ((["generate", "--model", model, "--prompt", "x"], model),
                       (["--data-dir", data, "generate", "--model", "default", "--prompt", "x"], data)):
        proc = _run(["-m", "cli.main", *args], {}, tmp_path)
        assert proc.returncode == 2, proc.stderr.decode()
        assert proc.stderr.decode().strip() == f"parley: {path}: ~no-such-user-7 is no user's home folder here."


def test_a_model_in_a_folder_the_locale_cannot_encode_is_converted_and_cached(tiny_models, tmp_path):
    """Under an ASCII locale a folder named Jöse reaches Python as surrogate escapes: the cache's key and its
    `source` file were encoded as UTF-8 text, which raised, and the model did not load."""
    folder = tmp_path / "Jöse 模型"
    folder.mkdir()
    model = folder / "model file.gguf"
    shutil.copyfile(tiny_models["qwen3"].gguf_path, model)
    ascii_locale = {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    for _ in range(2):  # the second load reads the entry the first wrote
        proc = _run(["-m", "cli.main", "generate", "--weights", "dequantized", "--model", str(model), "--prompt", "x",
                     "--max-tokens", "1", "--json"], ascii_locale, tmp_path)
        assert proc.returncode == 0, proc.stderr.decode()
    (entry,) = (tmp_path / "home" / "cache" / "converted").iterdir()
    assert (entry / "source").read_bytes() == os.fsencode(model.resolve())
