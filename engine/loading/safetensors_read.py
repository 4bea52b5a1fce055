"""A safetensors file read into memory with plain reads. safetensors' own loader maps the file: a file cut short after
that (a sync tool, a copy over it, a cleaner) killed the process with SIGBUS at the next touch of a lost page, mid-answer."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
MAX_HEADER = 100 << 20  # safetensors' own bound on the JSON header


class SafetensorsUnreadable(ValueError):
    """The file is not a whole safetensors file (cut short, damaged, or of a type this reader does not take)."""


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the file, in memory of its own: nothing stays mapped, so later changes to the file touch none."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        header, base = _header(f, size)
        return {name: _tensor(f, name, info, base, size) for name, info in header.items()}


def _header(f, size: int) -> tuple[dict, int]:
    raw = f.read(8)
    if len(raw) < 8:
        raise SafetensorsUnreadable(f"{size} bytes: no header")
    (n,) = struct.unpack("<Q", raw)
    if n > min(MAX_HEADER, size - 8):
        raise SafetensorsUnreadable(f"a header of {n} bytes in a file of {size}")
    try:
        header = json.loads(f.read(n))
    except ValueError as exc:
        raise SafetensorsUnreadable(f"the header does not read ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsUnreadable("the header is not a table")
    header.pop("__metadata__", None)
    return header, 8 + n


def _tensor(f, name: str, info: dict, base: int, size: int) -> torch.Tensor:
    try:
        dtype, shape, (start, end) = DTYPES[info["dtype"]], info["shape"], info["data_offsets"]
        tensor = torch.empty(shape, dtype=dtype)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise SafetensorsUnreadable(f"{name}: {exc!r}") from None
    nbytes = tensor.numel() * tensor.element_size()
    if start < 0 or end - start != nbytes or base + end > size:
        raise SafetensorsUnreadable(f"{name} lies past the end of the file or is not its shape's size")
    if nbytes:
        f.seek(base + start)
        into = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
        read = 0
        while read < nbytes:  # readinto may return less than asked (large reads, signals)
            got = f.readinto(into[read:])
            if not got:
                raise SafetensorsUnreadable(f"{name} was cut short while it was read")
            read += got
    return tensor
