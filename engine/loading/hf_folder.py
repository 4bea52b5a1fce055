"""Reading a Hugging Face model folder: config.json and safetensors shards."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from engine.errors import ModelLoadError, UnsupportedModelError


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no config.json: it is not a Hugging Face model folder.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} is not a JSON object of settings.")
    return config


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
        files = [folder / n for n in _indexed_shards(index)]
    else:
        files = sorted(folder.glob("*.safetensors"))
        files += sorted({p for f in files for p in _named_shards(f)} - set(files))  # a shard gone, named by the others
    if not files:
        raise ModelLoadError(f"{folder} has no .safetensors weights (PyTorch .bin checkpoints are not supported).")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelLoadError(f"{folder} is missing weight shards: {', '.join(missing)}")
    return files


SHARD_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.safetensors$")  # transformers' "model-00001-of-00002.safetensors"


def _named_shards(f: Path) -> list[Path]:
    """Every shard of the set `f`'s name says it belongs to (without an index, the files that must be there)."""
    m = SHARD_NAME.search(f.name)
    if m is None:
        return []
    count = int(m.group(2))
    return [f.with_name(f"{f.name[:m.start()]}-{i:05d}-of-{count:05d}.safetensors") for i in range(1, count + 1)]


def _indexed_shards(index: Path) -> list[str]:
    """The shard file names an index maps tensors to: plain names inside the folder, or one clear error."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"{index} is not a safetensors index (a JSON object with a weight_map): {exc!s}") from exc
    outside = [n for n in names if not isinstance(n, str) or Path(n).name != n or n in ("", ".", "..")]
    if outside:  # "../other/model.safetensors" would read weights from elsewhere on the disk
        raise ModelLoadError(f"{index} maps tensors to files outside the folder: {', '.join(map(str, outside[:3]))}")
    return names


SAFETENSORS_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                           "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
HEADER_LIMIT = 100 << 20  # a safetensors header is JSON of names and shapes: larger is a damaged file


def tensor_shapes(folder: Path) -> list[tuple[tuple[int, ...], float]]:
    """(shape, bytes per element) of every tensor in the folder's shards, from their headers alone (nothing loads)."""
    return [shape for f in safetensor_files(folder) for shape in file_tensor_shapes(f)]


def file_header(f: Path) -> dict[str, dict[str, Any]]:
    """Name -> {"dtype", "shape", "data_offsets"} of every tensor in one safetensors file, from its header alone."""
    with f.open("rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        if not 0 < size <= HEADER_LIMIT:
            raise ModelLoadError(f"{f.name} is not a safetensors file (header of {size} bytes).")
        try:
            header = json.loads(fh.read(size))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"{f.name} could not be read (damaged safetensors header: {exc})") from exc
    if not isinstance(header, dict):
        raise ModelLoadError(f"{f.name} could not be read (damaged safetensors header: not a JSON object)")
    return {name: info for name, info in header.items() if name != "__metadata__"}


def file_tensor_shapes(f: Path) -> list[tuple[tuple[int, ...], float]]:
    """(shape, bytes per element) of every tensor in one safetensors file, from its header alone."""
    out = []
    for name, info in file_header(f).items():
        shape = tuple(int(d) for d in info["shape"])
        if name.endswith("_blocks") and info["dtype"] == "U8" and len(shape) >= 2:  # MXFP4 (gpt-oss): 2 per byte
            shape = (*shape[:-2], shape[-2] * shape[-1] * 2)
            out.append((shape, 0.5))
        else:
            out.append((shape, SAFETENSORS_DTYPE_BYTES.get(info["dtype"], 4)))
    return out


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
