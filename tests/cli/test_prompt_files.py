"""A prompt file as editors on other systems save it: with a byte-order mark, or in UTF-16 / UTF-32; and one too
long to be a prompt, refused once that much is read."""
from __future__ import annotations

import argparse
import codecs
import io
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from cli.prompts import BYTES_PER_TOKEN, STDIN, PromptBound, PromptFile, read_prompts
from engine.errors import ParleyError

TEXT = "Résumé this:\nÜber 2 lines"


def _read(path: str, tokens: int = 8192) -> str:
    return read_prompts(argparse.Namespace(prompts=[PromptFile(path)]), PromptBound(tokens))[0]


@pytest.mark.parametrize("mark, encoding", [
    (codecs.BOM_UTF8, "utf-8"),  # Notepad's "UTF-8 with BOM": the mark went to the model as U+FEFF
    (codecs.BOM_UTF16_LE, "utf-16-le"),  # PowerShell 5's `>`: refused as 'not UTF-8 text (byte 0)'
    (codecs.BOM_UTF16_BE, "utf-16-be"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
])
def test_a_marked_file_reads_as_its_mark_says(tmp_path, mark, encoding):
    path = tmp_path / "prompt.txt"
    path.write_bytes(mark + (TEXT + "\r\n").encode(encoding))
    assert _read(str(path)) == TEXT


def test_a_marked_stdin_loses_its_mark(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("\ufeff" + TEXT))
    assert _read(STDIN) == TEXT


def test_a_file_without_a_mark_is_still_read_as_utf8_only(tmp_path):
    path = tmp_path / "utf16-unmarked.txt"
    path.write_bytes(TEXT.encode("utf-16-le"))  # no mark: nothing says so, and it is not guessed
    with pytest.raises(ParleyError, match=r"is not UTF-8 text \(byte 2\): save it as UTF-8\.$"):
        _read(str(path))


@pytest.mark.parametrize("given", [[PromptFile(STDIN)], []])  # --prompt-file -, and a piped stdin
def test_a_stdin_that_is_not_utf8_is_refused_as_a_file_is(monkeypatch, given):
    """A file's stray byte was refused, stdin's went to the model as U+FFFD (`cat latin1.txt | parley generate`)."""
    stdin = io.TextIOWrapper(io.BytesIO("Résumé \xff".encode("latin-1")), encoding="utf-8", errors="surrogateescape")
    monkeypatch.setattr("sys.stdin", stdin)  # as cli/main.py reconfigures it
    with pytest.raises(ParleyError, match=r"^The prompt on stdin is not UTF-8 text \(byte 1\): save it as UTF-8\.$"):
        read_prompts(argparse.Namespace(prompts=given), PromptBound(8192))


def test_utf8_on_stdin_under_an_ascii_locale_reads_as_it_is(monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO(TEXT.encode()), encoding="ascii", errors="surrogateescape")
    monkeypatch.setattr("sys.stdin", stdin)
    assert _read(STDIN) == TEXT


def test_a_file_longer_than_the_context_could_take_is_refused_before_the_model_loads(tiny_models, tmp_path, capsys):
    """A 50 MB file was read whole, loaded the model and was refused after ~15 s at 728 MB resident."""
    big = tmp_path / "big.txt"
    with big.open("wb") as file:
        file.truncate(64 * BYTES_PER_TOKEN + 1)  # sparse: a byte over what 64 tokens could stand for
    assert main(["--data-dir", str(tmp_path), "generate", "--model", str(tiny_models["qwen3"].gguf_path),
                 "--context", "64", "--prompt-file", str(big)]) == 2
    assert capsys.readouterr().err == (f"parley: The prompt file {big} is over 32,768 bytes, more than a prompt of 64 "
                                       "tokens can be (512 bytes a token at most): shorten it, or raise --context "
                                       "(64 now).\n")


def test_a_file_at_the_bound_is_read(tmp_path):
    path = tmp_path / "full.txt"
    path.write_text("a" * 2 * BYTES_PER_TOKEN)
    assert len(_read(str(path), tokens=2)) == 2 * BYTES_PER_TOKEN


def test_stdin_is_read_no_further_than_the_bound(monkeypatch):
    """`yes | parley generate` read forever."""
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * (BYTES_PER_TOKEN + 1)))
    with pytest.raises(ParleyError, match=r"^The prompt on stdin is over 1,024 characters, more than a prompt of 2 "):
        read_prompts(argparse.Namespace(prompts=[]), PromptBound(2))


def _limited_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # unbounded, the read ends in a MemoryError, not a swap


def test_dev_zero_is_refused_not_read_forever():
    code = ("import argparse; from cli.prompts import *; "
            "read_prompts(argparse.Namespace(prompts=[PromptFile('/dev/zero')]), PromptBound(8192))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2], preexec_fn=_limited_memory)
    assert "ParleyError: The prompt file /dev/zero is over 4,194,304 bytes" in done.stderr
