"""Writing a file whole or not at all: a full disk or a crash mid-write leaves the file as it was, not cut off."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable


def write_text_whole(file: Path, text: str | Iterable[str], synced: bool = True) -> None:
    """Writes `text` (UTF-8) beside `file` and renames it over the file; raises OSError as the write would. A link
    is written where it leads (a dotfiles folder's settings.json stays a link). `synced` False: whole after a crash or
    a kill of Parley, not after a power cut (the two fsyncs cost 12 ms on a VM's disk)."""
    target = link_target(file)
    partial = target.with_name(target.name + ".partial")
    text = [text] if isinstance(text, str) else list(text)  # pieces written as they come; twice where it falls back
    try:
        _write_synced(partial, text, synced)
        os.replace(partial, target)
        if synced:
            _sync_folder(target.parent)
    except PermissionError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        if partial.parent.exists() and not os.access(partial.parent, os.W_OK) and os.access(target, os.W_OK):
            _write_synced(target, text, synced=False)  # a writable file in a folder that is not
            return
        raise
    except OSError:
        with contextlib.suppress(OSError):  # a full disk's cut-off copy is not left beside the file
            partial.unlink(missing_ok=True)
        raise


def _write_synced(file: Path, text: list[str], synced: bool = True) -> None:
    """The bytes reach the disk before the rename can: without it a power cut after the rename left the file empty
    (ext4 with a file new to the folder, or mounted noauto_da_alloc; XFS), old contents gone too. `text` in pieces: each
    encoded and written as it comes (a chat export's 25 MB encoded at once held the GIL 60 ms)."""
    with open(file, "w", encoding="utf-8", errors="replace") as out:
        for piece in text:
            out.write(piece)
        out.flush()
        if synced:
            os.fsync(out.fileno())


def _sync_folder(folder: Path) -> None:
    """The rename itself reaches the disk (a new export is otherwise missing after a power cut); not on Windows."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # a folder some file systems cannot sync: the file's own bytes are safe already
    finally:
        os.close(fd)


def link_target(file: Path) -> Path:
    """Where `file` leads; the file itself for a loop of links (written over as a file)."""
    try:
        return file.resolve()
    except (OSError, RuntimeError):
        return file
