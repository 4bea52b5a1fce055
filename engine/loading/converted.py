"""A cache of GGUF files already dequantized: later starts read safetensors instead of decoding again."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch

from engine.models.args import ModelArgs
from engine.tokenizer import Tokenizer

FORMAT = 1


def entry_dir(cache_dir: Path, gguf_path: Path, folder: str = "converted", version: str = str(FORMAT)) -> Path:
    """One folder per (path, size, mtime, version) under `folder`: a replaced file gets a fresh entry."""
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{version}"
    return Path(cache_dir) / folder / f"{gguf_path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def write_entry(d: Path, fill: Callable[[Path], None]) -> None:
    """`fill` writes an entry into a temporary folder, which is marked complete and renamed to `d`, so a crash never
    leaves a half entry; a full or read-only cache only costs speed next time."""
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=d.parent, prefix=".tmp-"))
    except OSError:
        return
    try:
        fill(tmp)
        (tmp / "complete").write_text("1")
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def load(cache_dir: Path, gguf_path: Path):
    """(args, weights, tokenizer) from the cache, or None when absent or unreadable."""
    from safetensors.torch import load_file

    d = entry_dir(cache_dir, gguf_path)
    if not (d / "complete").exists():
        return None
    try:
        args = ModelArgs.from_dict(json.loads((d / "args.json").read_text()))
        weights = load_file(str(d / "model.safetensors"))
        tok = Tokenizer.load(d / "tokenizer")
    except Exception:
        shutil.rmtree(d, ignore_errors=True)  # a damaged entry is rebuilt from the GGUF
        return None
    return args, weights, tok


def save(cache_dir: Path, gguf_path: Path, args: ModelArgs, weights: dict[str, torch.Tensor], tok: Tokenizer) -> None:
    from safetensors.torch import save_file

    def fill(tmp: Path) -> None:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
        (tmp / "args.json").write_text(json.dumps(args.to_dict()))
        tok.save(tmp / "tokenizer")

    write_entry(entry_dir(cache_dir, gguf_path), fill)
