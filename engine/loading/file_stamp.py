"""What tells a model's files as they are now from the same files before a change in place: each file's inode and its
status-change time (ctime), which the system sets at every write and no user's tool sets back. The caches' keys hold
the size, the mtime and sampled bytes, which cp --preserve, touch -r or rsync -a keep for a file edited in place."""
from __future__ import annotations

from pathlib import Path

from engine.loading.gguf_split import model_files

Stamp = tuple[tuple[int, int], ...]  # (inode, ctime in ns) of each of a model's files, its first part first


def file_stamp(path: Path) -> Stamp:
    """The stamp of the model at `path`: a file, or every part of a split one on disk."""
    return tuple((st.st_ino, st.st_ctime_ns) for st in (part.stat() for part in model_files(path)))
