"""The model registry kept in the chat database, and the checks a model passes before it is imported.

Same interface as app.core.model_registry.ModelRegistry; the embedded default is never stored, so it is always there.
"""
from __future__ import annotations

import json
from pathlib import Path

from app.core.model_registry import ModelEntry, ModelRegistry, model_path
from app.core.sqlite_store import SqliteConversationStore
from engine.errors import ParleyError
from engine.loading.default_model import DEFAULT_NAME
from engine.loading.hf_folder import safetensor_files
from engine.models import RUNS, SUPPORTED

HF_TOKENIZER_FILES = ("tokenizer.json",)
MAX_CONFIG_BYTES = 1 << 20


def check_model(path: str | Path) -> str:
    """'gguf' or 'hf' for a model Parley can run; ValueError saying what is wrong otherwise.

    Reads headers and small JSON files: 0.2-0.5 s for a 262k-token vocabulary, so the app runs it off the GUI thread.
    """
    p = model_path(path)  # a split model's first part, a folder's GGUF model
    if p.is_file() and p.suffix.lower() == ".gguf":
        return _check_gguf(p)
    if p.is_dir() and (p / "config.json").is_file():
        return _check_hf(p)
    raise ValueError(f"{p} is neither a .gguf file nor a Hugging Face folder with config.json.")


def _check_gguf(p: Path) -> str:
    from engine.loading.gguf_header import scan_header
    from engine.loading.gguf_split import merged, read_parts

    try:
        header = merged(read_parts(p, scan_header))  # every part of a split model
    except ParleyError as exc:
        raise ValueError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p.name} cannot be read: {exc}") from None
    arch = str(header.scalars.get("general.architecture", ""))
    if arch not in SUPPORTED:
        raise ValueError(f"{p.name}: architecture {arch or '(none)'!r} is not supported. {RUNS}")
    experts = header.scalars.get(f"{arch}.expert_count")
    # in any layer: ERNIE 4.5's first is dense
    if experts and not any(t.name.endswith(".ffn_gate_exps.weight") for t in header.tensors):
        raise ValueError(f"{p.name} says it is a mixture of {experts} experts but holds no expert tensors in the "
                         "layout llama.cpp writes today (blk.N.ffn_gate_exps).")
    if "tokenizer.ggml.model" not in header.scalars or not header.array_lengths.get("tokenizer.ggml.tokens"):
        raise ValueError(f"{p.name} has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens are missing).")
    if header.n_tensors == 0:
        raise ValueError(f"{p.name} holds no weights.")
    return "gguf"


def _check_hf(p: Path) -> str:
    cfg_path = p / "config.json"
    if cfg_path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{cfg_path} is too large to be a model config.")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{cfg_path} is not valid JSON: {exc}") from None
    kind = cfg.get("model_type") if isinstance(cfg, dict) else None
    if kind not in SUPPORTED:
        raise ValueError(f"{p.name}: architecture {kind!r} is not supported. {RUNS}")
    if not any((p / name).is_file() for name in HF_TOKENIZER_FILES):
        raise ValueError(f"{p.name} has no tokenizer.json.")
    try:
        safetensor_files(p)  # every shard its index or their names call for
    except ParleyError as exc:
        raise ValueError(str(exc)) from None
    return "hf"


class SqliteModelRegistry(ModelRegistry):
    """Imported models live in the store's `model` table; `legacy_file` (the old models.json) is read once."""

    def __init__(self, store: SqliteConversationStore, default_spec: str = DEFAULT_NAME, legacy_file: Path | None = None):
        super().__init__(None, default_spec)
        self.store = store
        if not store.models and legacy_file is not None and legacy_file.is_file() and not store.locked_out:
            self._migrate(legacy_file, default_spec)
        for row in store.models.values():
            if row["key"] != DEFAULT_NAME:
                self._imported[row["key"]] = ModelEntry(row["key"], row["name"], row["path"], row["kind"])

    def _migrate(self, legacy_file: Path, default_spec: str) -> None:
        """The old models.json's entries into the store, once: the file is renamed after (a model removed later came
        back at the next start, which read the file again). A file that does not read brings nothing over."""
        try:
            entries = ModelRegistry(legacy_file, default_spec).entries()[1:]
        except (OSError, ValueError, TypeError, KeyError):  # damaged or hand-edited: it kept the app from opening
            entries = []
        for entry in entries:
            self.store.save_model(entry.key, entry.name, entry.path, entry.kind)
        if self.store.persistent:
            try:
                legacy_file.replace(legacy_file.with_name(legacy_file.name + ".migrated"))
            except OSError:
                pass

    def candidate(self, path: str | Path, name: str | None = None, check: bool = True) -> ModelEntry:
        """The entry for a path not yet added; with `check`, only once check_model passes (without: what the path
        names, known without reading the model, for the GUI thread to show while the check runs elsewhere)."""
        if check:
            check_model(path)
        return super().candidate(path, name)

    def _save(self) -> None:
        stored = set(self.store.models)
        for key in stored - self._imported.keys():
            self.store.remove_model(key)
        for key, e in self._imported.items():
            if key not in stored:
                self.store.save_model(e.key, e.name, e.path, e.kind)
