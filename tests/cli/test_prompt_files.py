"""A prompt file as editors on other systems save it: with a byte-order mark, or in UTF-16 / UTF-32."""
from __future__ import annotations

import argparse
import codecs
import io

import pytest

from cli.prompts import STDIN, PromptFile, read_prompts
from engine.errors import ParleyError

TEXT = "Résumé this:\nÜber 2 lines"


def _read(path: str) -> str:
    return read_prompts(argparse.Namespace(prompts=[PromptFile(path)]))[0]


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
        read_prompts(argparse.Namespace(prompts=given))


def test_utf8_on_stdin_under_an_ascii_locale_reads_as_it_is(monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO(TEXT.encode()), encoding="ascii", errors="surrogateescape")
    monkeypatch.setattr("sys.stdin", stdin)
    assert _read(STDIN) == TEXT
