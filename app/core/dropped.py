"""What a file dropped on the window is: a model to import, a Parley export of chats, or text for the message box."""
from __future__ import annotations

import json
from pathlib import Path

from app.core.export import FORMAT, MD_MARK
from engine.errors import ParleyError

MAX_TEXT_BYTES = 1 << 20  # a dropped document goes into the prompt: past this it would not fit a context anyway
SNIFF_BYTES = 64 << 10  # enough of a file to tell an export from a document


def kind_of(path: Path) -> str:
    """'model' (a .gguf file, a Hugging Face folder), 'chats' (a Parley export), or 'text' (anything else: its text
    is read into the message box, or refused there)."""
    if path.is_dir():
        return "model"
    if path.suffix.lower() == ".gguf":
        return "model"
    if path.suffix.lower() in (".json", ".md") and _is_export(path):
        return "chats"
    return "text"


def _is_export(path: Path) -> bool:
    """A JSON file in Parley's export format, or Markdown holding Parley's message markers."""
    try:
        with path.open("rb") as f:
            head = f.read(SNIFF_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return False
    if path.suffix.lower() == ".md":
        return head.startswith("# ") and MD_MARK.search(head) is not None
    return f'"format": "{FORMAT}"' in head or _json_format(path, head) == FORMAT


def _json_format(path: Path, head: str) -> str | None:
    """The "format" field of a small JSON file written without Parley's spacing."""
    if f'"{FORMAT}"' not in head:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.stat().st_size <= SNIFF_BYTES else None
    except (OSError, ValueError):
        return None
    return data.get("format") if isinstance(data, dict) else None


def dropped_text(path: Path) -> str:
    """The text of a dropped document, or a ParleyError saying in one line why it cannot go into a message."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise ParleyError(f"{path.name} is not a regular file.")
        if size > MAX_TEXT_BYTES:
            raise ParleyError(f"{path.name} is {size / 1e6:.1f} MB; a file dropped into a message may hold up to "
                              f"{MAX_TEXT_BYTES // 1_000_000} MB of text.")
        raw = path.read_bytes()
    except OSError as exc:
        raise ParleyError(f"{path.name} could not be read: {exc.strerror or exc}.") from None
    if b"\x00" in raw[:SNIFF_BYTES]:
        raise ParleyError(f"{path.name} is not a text file.")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ParleyError(f"{path.name} is not UTF-8 text.") from None
    return text.replace("\r\n", "\n")
