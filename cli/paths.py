"""Where Parley keeps its files: the platform's user directories, or one folder given by --data-dir / PARLEY_HOME."""
from __future__ import annotations

import argparse
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
        """--data-dir, else $PARLEY_HOME (unset or empty: the platform's folders)."""
        root = data_dir or os.environ.get("PARLEY_HOME") or None
        if root is not None and not root.strip():  # a folder named " " in the working folder was made and filled
            raise ParleyError(f"{'--data-dir' if data_dir else 'PARLEY_HOME'} is blank ({root!r}): set it to the folder "
                              "Parley keeps its data in, or unset it for the platform's user folders.")
        if root:
            base = expand_home(root, ParleyError)
            return cls(base, base / "models", base / "cache")
        import platformdirs

        data = Path(platformdirs.user_data_dir("Parley", appauthor=False))
        return cls(data, data / "models", Path(platformdirs.user_cache_dir("Parley", appauthor=False)))


KERNEL_CACHE_ENV = "PARLEY_KERNEL_CACHE"  # where kernels/cpu_native.py builds the CPU library


def keep_kernels_under(paths: Paths) -> None:
    """The CPU kernel library is built under the data folder's cache, beside the converted weights: with --data-dir
    or PARLEY_HOME it landed in the platform's cache folder. A PARLEY_KERNEL_CACHE of the user's own wins."""
    if not os.environ.get(KERNEL_CACHE_ENV, "").strip():
        os.environ[KERNEL_CACHE_ENV] = str(paths.cache / "kernels")


def data_dir_arg(text: str) -> str:
    """--data-dir's value: a blank one (`--data-dir "$DIR"` with DIR unset) read as no flag, and the user's real data
    folder was used, or a folder named " " made where the command ran."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"a folder to keep the data in, not {text!r}")
    return text
