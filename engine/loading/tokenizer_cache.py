"""A cache of the SentencePiece tokenizers built from GGUF `llama` vocabularies: building the model from the pieces and
scores is a large part of a load (the embedded Gemma 3's 262,144 pieces: a load took 5.65-6.51 s building it, 3.11-3.71 s
reading the saved 5.4 MB; docs/QUANTIZED.md). Keyed by the file (path, size, mtime) and by the code that builds
tokenizers, so a changed file, or a Parley whose tokenizer code changed, builds afresh; the entry it replaces is removed.
`gpt2` vocabularies build their BPE directly: no cache."""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
from functools import lru_cache
from pathlib import Path

import engine.tokenizer
from engine.errors import TokenizerError
from engine.loading.converted import drop_older, entry_dir, write_entry
from engine.loading.gguf_file import GGUFFile
from engine.tokenizer import Tokenizer
from engine.tokenizer.from_gguf import tokenizer_from_gguf

FOLDER = "tokenizers"


def gguf_tokenizer(gf: GGUFFile, cache_dir: Path | None) -> Tokenizer:
    """The file's tokenizer: from the cache when an entry for it is there and reads, else built (and saved)."""
    if cache_dir is None or gf.metadata.get("tokenizer.ggml.model") != "llama":
        return tokenizer_from_gguf(gf.metadata)
    d = entry_dir(cache_dir, gf.path, FOLDER, _code_version())
    if (d / "complete").exists():
        try:
            return Tokenizer.load(d / "tokenizer")
        except TokenizerError:
            shutil.rmtree(d, ignore_errors=True)  # a damaged entry is rebuilt
    tok = tokenizer_from_gguf(gf.metadata)
    source = os.fsencode(gf.path.resolve())

    def fill(tmp: Path) -> None:
        tok.save(tmp / "tokenizer")
        (tmp / "source").write_bytes(source)

    write_entry(d, fill)
    drop_older(d, source)
    return tok


@lru_cache(maxsize=1)
def _code_version() -> str:
    """What a saved tokenizer was built by: a digest of engine/tokenizer's source, or in a packaged app (no sources)
    the app's executable."""
    if getattr(sys, "frozen", False):
        st = Path(sys.executable).stat()
        return f"app-{st.st_size}-{st.st_mtime_ns}"
    digest = hashlib.sha256()
    for f in sorted(Path(engine.tokenizer.__file__).parent.glob("*.py")):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]
