"""Reading a GGUF file: metadata as Python values and tensors dequantized to torch."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.loading.gguf_header import scan_header

GGUF_MAGIC = b"GGUF"


@dataclass(slots=True)
class GGUFFile:
    """An opened GGUF file; `metadata` maps each key to a plain Python value."""

    path: Path
    reader: Any
    metadata: dict[str, Any]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def tensor_names(self) -> list[str]:
        return [t.name for t in self.reader.tensors]

    def tensor(self, t: Any) -> torch.Tensor:
        """One of `reader.tensors` dequantized to fp32."""
        return _dequantize(self.path, t)


def open_gguf(path: str | Path) -> GGUFFile:
    """Opens and validates a GGUF file, raising ModelLoadError with the reason when it cannot."""
    import gguf

    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"Model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"Not a file: {path}")
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelLoadError(f"{path.name} is not a GGUF file (wrong magic bytes).")
    scan_header(path)  # refuses impossible counts and shapes before GGUFReader allocates for them
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as exc:  # gguf raises ValueError/IndexError/struct errors on damaged files
        raise ModelLoadError(f"{path.name} is damaged or truncated: {exc}") from exc
    metadata = {name: _field_value(field) for name, field in reader.fields.items()}
    _check_tensor_extents(path, reader)
    return GGUFFile(path=path, reader=reader, metadata=metadata)


def _field_value(field: Any) -> Any:
    try:
        return field.contents()
    except Exception as exc:
        raise ModelLoadError(f"Unreadable GGUF metadata field {field.name!r}: {exc}") from exc


def _check_tensor_extents(path: Path, reader: Any) -> None:
    """A truncated file shows up as tensor data running past its end."""
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelLoadError(
                f"{path.name} is truncated: tensor {t.name} needs bytes up to {end:,} but the file has {size:,}."
            )


def _dequantize(path: Path, t: Any) -> torch.Tensor:
    import gguf

    qtype = t.tensor_type
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims innermost first
    try:
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            arr = np.array(t.data, dtype=np.float32)  # a copy: the memmap is read-only
        elif qtype == gguf.GGMLQuantizationType.BF16:
            raw = np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = gguf.quants.dequantize(t.data, qtype)
    except NotImplementedError as exc:
        raise UnsupportedModelError(
            f"{path.name}: tensor {t.name} uses quantization type {qtype.name}, which Parley cannot read yet."
        ) from exc
    except Exception as exc:
        raise ModelLoadError(f"{path.name}: tensor {t.name} could not be decoded: {exc}") from exc
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(shape))
