"""A cache of the SentencePiece tokenizers built from GGUF `llama` vocabularies: building the model from the pieces and
scores is a large part of a load (the embedded Gemma 3's 262,144 pieces: a load took 5.65-6.51 s building it, 3.11-3.71 s
reading the saved 5.4 MB; docs/QUANTIZED.md). Keyed by the file (path, size, mtime; its stamp: converted.current) and
by the code that builds tokenizers, so a changed file, or a Parley whose tokenizer code changed, builds afresh; the
entry it replaces is removed. `gpt2` vocabularies build their BPE at every load, from their arrays saved in the entry
(engine/loading/saved_vocabulary.py). An entry also says where the vocabulary's arrays lie in the file: a load that
finds the tokenizer or the arrays reads the header without them (`vocabulary_spans`), where walking 262,144 token
strings was ~0.3 s of Python beside the app's window."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import engine.tokenizer
from engine.errors import TokenizerError
from engine.loading.converted import current, drop_older, entry_dir, fresh, unwritable, write_entry
from engine.loading.file_stamp import file_stamp
from engine.loading.gguf_file import GGUFFile
from engine.loading.gguf_header import Span, read_header
from engine.loading.saved_vocabulary import FILE as VOCABULARY_FILE, load_vocabulary, save_vocabulary
from engine.tokenizer import Tokenizer
from engine.tokenizer.from_gguf import tokenizer_from_gguf

FOLDER = "tokenizers"
SPANS_FILE = "vocabulary_spans.json"
VOCABULARY = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
SAVED_TOKENIZER = "llama"  # the vocabulary whose entry holds the built tokenizer; `gpt2` entries hold its arrays


def gguf_tokenizer(gf: GGUFFile, cache_dir: Path | None, notices: list[str] | None = None) -> Tokenizer:
    """The file's tokenizer: from the cache when an entry for it is there and reads, else built (and saved; where it
    cannot be, `notices` gets a line)."""
    model = gf.metadata.get("tokenizer.ggml.model")
    if cache_dir is None or model not in (SAVED_TOKENIZER, "gpt2"):
        return tokenizer_from_gguf(_metadata(gf))
    d = entry_dir(cache_dir, gf.path, FOLDER, _code_version())
    stamp = getattr(gf, "stamp", None) or file_stamp(gf.path)  # of the header read, where open_gguf took it
    if current(d, stamp):
        try:
            tok = _from_entry(d, gf, model)
            _add_spans(d, gf, model)
            return tok
        except TokenizerError:
            shutil.rmtree(d, ignore_errors=True)  # a damaged entry is rebuilt
    metadata = _metadata(gf)
    tok = tokenizer_from_gguf(metadata)
    source = os.fsencode(gf.path.resolve())

    def fill(tmp: Path) -> None:
        if model == SAVED_TOKENIZER:
            tok.save(tmp / "tokenizer")
        if model == SAVED_TOKENIZER or save_vocabulary(tmp, metadata):  # the header's arrays are needed no more
            _write_spans(tmp, gf)
        (tmp / "source").write_bytes(source)

    if not write_entry(d, fill, stamp) and notices is not None and model == SAVED_TOKENIZER:  # a BPE builds anyway
        notices.append(unwritable(cache_dir, f"{gf.path.name}'s tokenizer"))
    drop_older(d, source)
    return tok


def vocabulary_spans(cache_dir: Path | None, path: Path) -> dict[str, Span]:
    """Where the vocabulary's arrays lie in the GGUF file at `path`, when its tokenizer or those arrays are saved
    (open_gguf's `skip`); empty otherwise."""
    if cache_dir is None:
        return {}
    try:
        d = entry_dir(cache_dir, path, FOLDER, _code_version())
        if not fresh(d, path):  # spans of the file before it changed in place would not be its own
            return {}
        data = json.loads((d / SPANS_FILE).read_text(encoding="utf-8"))
        return {key: Span(*map(int, data[key])) for key in VOCABULARY if key in data}
    except (OSError, ValueError, TypeError, KeyError):  # none yet, or damaged: the header is read whole
        return {}


def _from_entry(d: Path, gf: GGUFFile, model: str) -> Tokenizer:
    if model == SAVED_TOKENIZER:
        return Tokenizer.load(d / "tokenizer")
    arrays = load_vocabulary(d)  # None: not saved (a token held its separator), the header has them
    return tokenizer_from_gguf(_metadata(gf) if arrays is None else {**gf.metadata, **arrays})


def _metadata(gf: GGUFFile) -> dict[str, Any]:
    """The metadata with the vocabulary: read again whole where the open passed over it (a saved tokenizer that no
    longer reads)."""
    if not getattr(gf, "skipped", None):
        return gf.metadata
    return read_header(gf.path).fields


def _write_spans(d: Path, gf: GGUFFile) -> None:
    spans = {key: [s.start, s.end, s.length] for key, s in getattr(gf, "spans", {}).items() if key in VOCABULARY}
    if spans:
        (d / SPANS_FILE).write_text(json.dumps(spans), encoding="utf-8")


def _add_spans(d: Path, gf: GGUFFile, model: str) -> None:
    """An entry saved before entries held spans gets them now, whole or not at all (a reader may be reading it)."""
    if (d / SPANS_FILE).exists() or (model != SAVED_TOKENIZER and not (d / VOCABULARY_FILE).exists()):
        return
    try:
        tmp = Path(tempfile.mkdtemp(dir=d, prefix=".spans-"))
        try:
            _write_spans(tmp, gf)
            if (tmp / SPANS_FILE).exists():
                os.replace(tmp / SPANS_FILE, d / SPANS_FILE)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # a read-only cache: the header is read whole, as before


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
