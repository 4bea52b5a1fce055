"""Where Parley keeps its files: the platform's user directories, or one folder given by --data-dir / PARLEY_HOME."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ParleyError
from engine.loading.default_model import expand_home


@dataclass(frozen=True, slots=True)
class Paths:
    data: Path  # chats, settings, imported-model registry
    models: Path  # the assembled embedded model
    cache: Path  # converted weights: safe to delete

    @classmethod
    def resolve(cls, data_dir: str | None = None) -> "Paths":
        root = data_dir or os.environ.get("PARLEY_HOME")
        if root:
            base = expand_home(root, ParleyError)
            return cls(base, base / "models", base / "cache")
        import platformdirs

        data = Path(platformdirs.user_data_dir("Parley", appauthor=False))
        return cls(data, data / "models", Path(platformdirs.user_cache_dir("Parley", appauthor=False)))
