"""JsonPieces reads what json.loads reads, and refuses what it refuses with the same message: an export parsed a
message at a time (json.loads of a 25 MB file held the GIL, and the window, 160 ms). A Markdown export read in pieces
splits into the chats the whole text did."""
from __future__ import annotations

import json
import random
import re
from functools import partial

from app.core.export import PIECES, _markdown_blocks, _unix_lines
from app.core.json_stream import JsonPieces

DOC = {"format": "parley-chats", "version": 1, "conversations": [
    {"title": "A \"quoted\" title ✓", "settings": {"temperature": 0.7, "seed": None}, "leaf": 1, "pinned": True,
     "messages": [{"id": 0, "parent": None, "role": "user", "content": "hi\n[{"},
                  {"id": 1, "parent": 0, "role": "assistant", "content": "}]\\", "stats": {"a": [1, 2.5e3]}}]},
    {"title": "", "messages": []}, {"messages": {}}, [], 3]}


def _outcome(read, text: str):
    try:
        return "ok", read(text)
    except json.JSONDecodeError as exc:
        return "error", str(exc)


def _pieces(text: str, size: int = 1 << 20):
    return JsonPieces([text[i:i + size] for i in range(0, len(text), size)]).document(PIECES)


def test_pieces_read_as_json_loads_does_on_texts_cut_and_damaged():
    rng = random.Random(7)
    texts = [json.dumps(DOC, indent=indent, ensure_ascii=ascii) for indent in (None, 1, 4) for ascii in (True, False)]
    texts += ["", " ", "{}", "[]", '{"conversations": []}', '{"a": 1, "a": 2}', '{"a": 1,}', "[1,]", '{"a" 1}',
              '{"a": 1 "b": 2}', "{1: 2}", '{"conversations": [1 2]}', "{} x", " {\n} \n", '"text"', "nan", "NaN"]
    base = texts[:6]
    for _ in range(600):  # cut short, a character dropped, doubled or changed
        text = rng.choice(base)
        at = rng.randrange(len(text))
        text = rng.choice([text[:at], text[:at] + text[at + 1:], text[:at] + text[at] + text[at:],
                           text[:at] + rng.choice('{}[],:" \n1x') + text[at + 1:]])
        texts.append(text)
    for text in texts:  # whole, and cut in pieces of 1 to 9 characters (a value, a string, a line across pieces)
        size = rng.randrange(1, 10)
        whole = _outcome(json.loads, text)
        assert _outcome(_pieces, text) == whole == _outcome(partial(_pieces, size=size), text), text


def _split_whole(text: str) -> list[str]:
    """What markdown_chats split a whole text into before it read the text in pieces."""
    if text.partition("\n")[0].endswith("\r"):
        text = text.replace("\r\n", "\n")
    return re.split(r"\n\n---\n\n(?=# )", text.strip())


def test_markdown_in_pieces_splits_into_the_chats_the_whole_text_does():
    rng = random.Random(11)
    tokens = ["\n", "\r\n", "\r", "---", "# ", "#", "A", " ", "\t", "\u00a0", "\x1c", "\n\n---\n\n# T", "\n\n---\n\n",
              "x\n"]
    for case in range(3000):
        text = "".join(rng.choices(tokens, k=rng.randrange(0, 30)))
        size = rng.randrange(1, 12)
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        assert list(_markdown_blocks(_unix_lines(pieces))) == _split_whole(text), (case, text, size)


def test_a_number_cut_between_two_pieces_reads_whole():
    """A chat's times cut at a piece's end read as a shorter number, then 'Expecting ',' delimiter' at the rest: a valid
    3,000-chat export was refused ('The file is not valid JSON … (char 14680064)': 14 MiB in) about one import in five."""
    doc = {"format": "parley-chats", "version": 12345, "conversations": [
        {"title": "T", "created_at": 1765080000.123456, "leaf": 10, "pinned": False, "messages": [
            {"id": 0, "parent": None, "role": "user", "content": "x", "created_at": 1765080001.5e-3}]}]}
    for indent in (None, 1):
        text = json.dumps(doc, indent=indent)
        for size in range(1, len(text) + 1):
            pieces = [text[i:i + size] for i in range(0, len(text), size)]
            assert JsonPieces(pieces).document(PIECES) == doc, (indent, size)
