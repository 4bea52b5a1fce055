"""A cache of GGUF files already dequantized: later starts read safetensors instead of decoding again."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from engine.loading.file_stamp import Stamp, file_stamp
from engine.loading.folder_lock import folder_lock, opened_folder
from engine.loading.gguf_split import model_files
from engine.loading.safetensors_read import read_safetensors
from engine.models.args import ModelArgs
from engine.tokenizer import Tokenizer

FORMAT = 1
HASH_CHARS = 17  # "-" and 16 hex digits after the file's stem in an entry's name
TMP_PREFIX = ".tmp-"  # an entry being written
ABANDONED_AFTER_S = 60.0  # an unlocked temporary folder this old was left by a writer that died (its lock went with it)
SAMPLES, SAMPLE_BYTES = 16, 1 << 16  # pieces of a file read into its key: 1 MB, spread from its start to its end
STAMP = "stamp"  # an entry's file: the stamp (file_stamp.py) of the model's files when their reading began


def entry_dir(cache_dir: Path, gguf_path: Path, folder: str = "converted", version: str = str(FORMAT)) -> Path:
    """One folder per (path, size, mtime, sampled content, version) under `folder`: a replaced file gets a fresh
    entry, even one of the same size whose date was kept (cp -p, rsync -a, an unpacked archive). A split model's later
    parts count as its first does: one replaced under the same first part left the old weights in use. A file changed
    in place outside the sampled bytes keeps its key: the entry's stamp tells (`current`)."""
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{_sampled_digest(gguf_path, st.st_size)}|{version}"
    for part in model_files(gguf_path)[1:]:  # none for a file of its own: its key is as it was
        pst = part.stat()
        key += f"|{part.name}|{pst.st_size}|{pst.st_mtime_ns}|{_sampled_digest(part, pst.st_size)}"
    return Path(cache_dir) / folder / f"{gguf_path.stem}-{hashlib.sha256(os.fsencode(key)).hexdigest()[:HASH_CHARS - 1]}"


def _sampled_digest(path: Path, size: int) -> str:
    """A digest of SAMPLES pieces of the file at even steps (the whole file when it is smaller): two models of one
    size differ in their header or in every tensor's bytes, so some piece tells them apart."""
    digest = hashlib.sha256()
    step = max(SAMPLE_BYTES, size // SAMPLES)
    with path.open("rb") as f:
        for offset in range(0, size, step):
            f.seek(offset)
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def write_entry(d: Path, fill: Callable[[Path], None], stamp: Stamp | None = None) -> bool:
    """`fill` writes an entry into a temporary folder, which is marked complete and renamed to `d`, so a crash never
    leaves a half entry; a full or read-only cache only costs speed next time. The folder is locked while written:
    those a killed writer left (a whole fp32 copy, at worst) are removed by the next writer. An entry another Parley
    wrote meanwhile (started at the same time) is kept: same key, same content, and replacing it took it away from
    under a third one reading it, which then built its own. `stamp`: of the files as read, before the reading
    began; an entry of another stamp (the file changed in place since) is replaced. False where it could not be
    written (a read-only or full cache)."""
    if _kept(d, stamp):
        return True
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        drop_abandoned(d.parent)
        tmp = Path(tempfile.mkdtemp(dir=d.parent, prefix=TMP_PREFIX))
    except OSError:
        return False
    try:
        with folder_lock(tmp):
            fill(tmp)
            if stamp is not None:
                (tmp / STAMP).write_text(json.dumps(stamp))
            if not _kept(d, stamp):  # else written by another while this one filled
                (tmp / "complete").write_text("1")
                shutil.rmtree(d, ignore_errors=True)  # an incomplete one, or one of the file before it changed
                os.replace(tmp, d)
                return True
    except OSError:
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    return _kept(d, stamp)


def _kept(d: Path, stamp: Stamp | None) -> bool:
    return (d / "complete").exists() if stamp is None else current(d, stamp)


def current(d: Path, stamp: Stamp) -> bool:
    """Whether the complete entry `d` was made from the model's files as `stamp` finds them: a file changed in place
    keeping its size and mtime (cp --preserve) has the same key, and its old entry served the old weights (or its
    old tokenizer). An entry older Parleys wrote without a stamp is the files' if none changed after it was
    completed; it gets their stamp."""
    try:
        saved = (d / STAMP).read_text()
    except FileNotFoundError:
        return _adopted(d, stamp)
    except OSError:
        return False
    try:
        return tuple(map(tuple, json.loads(saved))) == stamp and (d / "complete").exists()
    except (ValueError, TypeError):
        return False


def _adopted(d: Path, stamp: Stamp) -> bool:
    try:
        completed = (d / "complete").stat().st_mtime_ns
    except OSError:
        return False
    if any(ctime > completed for _, ctime in stamp):
        return False
    try:  # whole or not at all: another Parley may be reading it
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".stamp-")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(stamp))
        os.replace(tmp, d / STAMP)
    except OSError:
        pass  # a read-only cache: told by its times again next time
    return True


def fresh(d: Path, gguf_path: Path) -> bool:
    """Whether `d` is a complete entry of the model's files as they are now; one of them before a change is removed
    (its stamp never comes back), so a bad file is refused by its own checks, not answered from its old copy."""
    if not (d / "complete").exists():
        return False
    try:
        stamp = file_stamp(gguf_path)
    except OSError:  # gone meanwhile: the load says so
        return False
    if current(d, stamp):
        return True
    shutil.rmtree(d, ignore_errors=True)
    return False


def drop_abandoned(folder: Path) -> None:
    """Removes the temporary folders under `folder` that no live writer holds (where the system has flock)."""
    try:
        import fcntl
    except ImportError:
        return
    for tmp in folder.glob(TMP_PREFIX + "*"):
        try:
            if time.time() - tmp.stat().st_mtime < ABANDONED_AFTER_S:
                continue  # just made: its writer may not hold the lock yet
            with opened_folder(tmp) as fd:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:  # held by its writer (or gone, or no locks here): left
            continue


def load(cache_dir: Path, gguf_path: Path, check: Callable[[ModelArgs, Path], None] | None = None):
    """(args, weights, tokenizer) from the cache, or None when absent or unreadable. `check(args, weights file)` runs
    before the weights are read: its error (a model that does not fit) is the caller's, the entry stays."""
    d = entry_dir(cache_dir, gguf_path)
    if not fresh(d, gguf_path):
        return None
    try:
        args = ModelArgs.from_dict(json.loads((d / "args.json").read_text()))
    except Exception:
        shutil.rmtree(d, ignore_errors=True)  # a damaged entry is rebuilt from the GGUF
        return None
    if check is not None:
        check(args, d / "model.safetensors")
    try:
        weights = read_safetensors(d / "model.safetensors")  # not mapped: the file may change under a running Parley
        tok = Tokenizer.load(d / "tokenizer")
    except Exception:
        shutil.rmtree(d, ignore_errors=True)  # a damaged entry is rebuilt from the GGUF
        return None
    return args, weights, tok


def save(cache_dir: Path, gguf_path: Path, args: ModelArgs, weights: dict[str, torch.Tensor], tok: Tokenizer,
         stamp: Stamp) -> bool:
    """Writes the entry of the weights read from the files that had `stamp` when their reading began; False where the
    cache could not take it."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    source = os.fsencode(gguf_path.resolve())  # bytes: a folder the locale cannot encode (Jöse under LANG=C) too

    def fill(tmp: Path) -> None:
        try:
            save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
        except SafetensorError as exc:  # its I/O errors (a full disk) are no OSError: the entry is given up as for one
            raise OSError(str(exc)) from exc
        (tmp / "args.json").write_text(json.dumps(args.to_dict()))
        tok.save(tmp / "tokenizer")
        (tmp / "source").write_bytes(source)

    d = entry_dir(cache_dir, gguf_path)
    written = write_entry(d, fill, stamp)
    drop_older(d, source)
    return written


def unwritable(cache_dir: Path, what: str) -> str:
    """The notice of a load whose cache entry could not be written: silent, every start paid for it again."""
    return (f"Parley's cache folder {cache_dir} could not be written (read-only or full): {what} is made again at "
            "every load, which takes longer.")


def drop_older(d: Path, source: bytes) -> None:
    """Removes the other entries of the same file (an older version of it, or of Parley): one entry per file, so a
    replaced model's converted copy (four bytes a weight) does not stay on disk for good."""
    for entry in d.parent.glob("*"):
        if entry != d and (_written_by(entry) == source or _older_format_of(entry, d)):
            shutil.rmtree(entry, ignore_errors=True)


def _written_by(entry: Path) -> bytes | None:
    try:
        return (entry / "source").read_bytes()
    except OSError:
        return None


def _older_format_of(entry: Path, d: Path) -> bool:
    """A complete entry of a file of the same name without a `source` (older Parleys wrote none): nothing
    told it apart, so an upgrade left a model's whole converted copy on disk for good; at worst another folder's file
    of that name is converted again."""
    same_name = len(entry.name) == len(d.name) and entry.name[:-HASH_CHARS] == d.name[:-HASH_CHARS]
    return same_name and (entry / "complete").exists() and not (entry / "source").exists()
