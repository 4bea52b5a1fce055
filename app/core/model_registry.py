"""ModelRegistry: the models the user can pick — the embedded default plus models imported from disk.

Kept as a JSON file for now; a SQLite registry replaces it behind the same small interface.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.errors import ModelLoadError
from engine.loading.default_model import DEFAULT_NAME
from engine.loading.gguf_split import model_file, model_name

EMBEDDED_LABEL = "Gemma 3 270M (embedded, base model)"


@dataclass(frozen=True, slots=True)
class ModelEntry:
    key: str  # "default" or the imported path
    name: str
    path: str  # "default" for the embedded model
    kind: str  # "embedded", "gguf" or "hf"


def kind_of(path: Path) -> str | None:
    """'gguf' for a .gguf file, 'hf' for a folder with config.json, None otherwise (checked before loading)."""
    if path.is_file() and path.suffix.lower() == ".gguf":
        return "gguf"
    if path.is_dir() and (path / "config.json").is_file():
        return "hf"
    return None


def _display_name(path: Path, kind: str) -> str:
    """A file's stem, a folder's name; in the Hugging Face cache (models--org--name/snapshots/<commit>/) the repo's
    id, not the commit hash that names the folder. A file may lie a folder deeper there: repos keep a split model's
    parts in a folder per quantization (<commit>/Q4_K_M/name-00001-of-00003.gguf)."""
    cache = path if kind == "hf" else path.parent
    if kind == "gguf" and cache.parent.parent.name == "snapshots":
        cache = cache.parent
    if cache.parent.name == "snapshots" and cache.parent.parent.name.startswith("models--"):
        repo = cache.parent.parent.name[len("models--"):].replace("--", "/")
        return repo if kind == "hf" else f"{repo} · {model_name(path)}"
    return model_name(path) if kind == "gguf" else path.name


def model_path(path: str | Path) -> Path:
    """The path a model is known by: a split model's first part for any of its parts, a folder's one GGUF model's
    first file (so each is listed once); absolute, a file keeping its own name (the Hugging Face cache links
    model.gguf to a blob named by its hash alone). ValueError for a folder of several GGUF models."""
    p = Path(path).expanduser()
    p = p.resolve() if p.is_dir() else p.parent.resolve() / p.name
    try:
        return model_file(p)
    except ModelLoadError as exc:
        raise ValueError(str(exc)) from None


class ModelRegistry:
    def __init__(self, file: Path | None = None, default_spec: str = DEFAULT_NAME):
        self.file = file
        self.default = ModelEntry(DEFAULT_NAME, EMBEDDED_LABEL if default_spec == DEFAULT_NAME else Path(default_spec).name,
                                  default_spec, "embedded")
        self._imported: dict[str, ModelEntry] = {}
        if file is not None and file.is_file():
            for row in json.loads(file.read_text(encoding="utf-8")):
                entry = ModelEntry(**row)
                self._imported[entry.key] = entry

    def entries(self) -> list[ModelEntry]:
        return [self.default, *self._imported.values()]

    def get(self, key: str) -> ModelEntry | None:
        return self.default if key == DEFAULT_NAME else self._imported.get(key)

    def candidate(self, path: str | Path, name: str | None = None) -> ModelEntry:
        """An entry for a path not yet added; raises ValueError when it is neither a GGUF file nor a HF folder."""
        p = model_path(path)
        kind = kind_of(p)
        if kind is None:
            raise ValueError(f"{p} is neither a .gguf file nor a Hugging Face folder with config.json.")
        return ModelEntry(str(p), name or _display_name(p, kind), str(p), kind)

    def add(self, entry: ModelEntry) -> None:
        """Adds an entry that has been validated (loaded by the engine)."""
        self._imported[entry.key] = entry
        self._save()

    def remove(self, key: str) -> None:
        self._imported.pop(key, None)
        self._save()

    def _save(self) -> None:
        if self.file is None:
            return
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.write_text(json.dumps([asdict(e) for e in self._imported.values()], indent=1), encoding="utf-8")
