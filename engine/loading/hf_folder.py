"""Reading a Hugging Face model folder: config.json and safetensors shards."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from engine.errors import ModelLoadError, UnsupportedModelError


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no config.json: it is not a Hugging Face model folder.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc


def model_type(config: dict[str, Any]) -> str:
    kind = config.get("model_type")
    if not kind:
        raise UnsupportedModelError("config.json does not name a model_type.")
    if kind == "gemma3" and "text_config" in config:
        return "gemma3"
    return str(kind)


def safetensor_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no .safetensors weights (PyTorch .bin checkpoints are not supported).")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelLoadError(f"{folder} is missing weight shards: {', '.join(missing)}")
    return files


def read_weights(folder: Path, progress=None) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = safetensor_files(folder)
    weights: dict[str, torch.Tensor] = {}
    for i, f in enumerate(files):
        try:
            weights.update(load_file(str(f)))
        except Exception as exc:
            raise ModelLoadError(f"{f.name} could not be read (damaged safetensors file?): {exc}") from exc
        if progress:
            progress("Reading weights", (i + 1) / len(files))
    return weights
