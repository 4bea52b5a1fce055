"""Reading a GGUF file: metadata as Python values and tensors dequantized to torch."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.loading.file_stamp import Stamp, file_stamp
from engine.loading.gguf_header import Span, TensorInfo, not_gguf, read_header
from engine.loading.gguf_split import mixed_quantization, read_parts
from engine.quant.gguf_blocks import to_float32

GGUF_MAGIC = b"GGUF"


class TensorSource:
    """The opened file, read a tensor at a time: a file cut short while it loads (a copy or download over it) is an
    error here, where a memory mapping's page past the new end killed the process with SIGBUS. Reads go to the file
    opened first, so one renamed over it or deleted meanwhile does not mix into the load."""

    def __init__(self, path: Path):
        self.name = path.name
        self._file = path.open("rb", buffering=0)
        self._lock = threading.Lock()  # seek and read as one

    def read(self, offset: int, n_bytes: int) -> np.ndarray:
        out = np.empty(n_bytes, dtype=np.uint8)
        view, done = memoryview(out), 0
        with self._lock:
            self._file.seek(offset)
            while done < n_bytes:
                got = self._file.readinto(view[done:])
                if not got:
                    raise self._cut_short()
                done += got
        return out

    def _cut_short(self) -> ModelLoadError:
        size = os.fstat(self._file.fileno()).st_size
        return ModelLoadError(f"{self.name} was cut short while it loaded (now {size:,} bytes): load it again once "
                              "it has been copied or downloaded whole.")

    def close(self) -> None:
        self._file.close()


class GGUFTensor:
    """One tensor of an opened file: its raw data is read from the file when asked for."""

    __slots__ = ("name", "shape", "tensor_type", "n_bytes", "_file", "offset")

    def __init__(self, info: TensorInfo, file: TensorSource):
        import gguf

        self.name, self.shape, self.n_bytes = info.name, info.shape, info.n_bytes
        self.tensor_type = gguf.GGMLQuantizationType(info.type_id)
        self._file, self.offset = file, info.offset  # offset: from the start of the file

    def rows(self, name: str, start: int, stop: int) -> "GGUFTensor":
        """Rows [start, stop) of this matrix as a tensor of its own (a fused q/k/v split): the same bytes, no copy."""
        if len(self.shape) != 2 or not 0 <= start < stop <= int(self.shape[1]) or self.n_bytes % int(self.shape[1]):
            raise ValueError(f"rows {start}..{stop} of {self.name} (shape {list(self.shape)}) do not exist")
        n, k = int(self.shape[1]), int(self.shape[0])
        part = object.__new__(GGUFTensor)
        row_bytes = self.n_bytes // n
        part.name, part.shape, part.tensor_type = name, [k, stop - start], self.tensor_type
        part._file, part.offset, part.n_bytes = self._file, self.offset + start * row_bytes, (stop - start) * row_bytes
        return part

    def expert(self, name: str, e: int) -> "GGUFTensor":
        """Expert `e`'s matrix (or bias) of a mixture of experts' stacked (experts, rows, cols) (or (experts, rows))
        tensor: the same bytes, no copy."""
        n = int(self.shape[-1]) if len(self.shape) in (2, 3) else 0
        if not 0 <= e < n or self.n_bytes % n:
            raise ValueError(f"expert {e} of {self.name} (shape {list(self.shape)}) does not exist")
        part = object.__new__(GGUFTensor)
        size = self.n_bytes // n
        part.name, part.shape, part.tensor_type = name, list(self.shape[:-1]), self.tensor_type
        part._file, part.offset, part.n_bytes = self._file, self.offset + e * size, size
        return part

    @property
    def file_name(self) -> str:
        """The name of the file that holds it (a split model's part): what an error about it names."""
        return self._file.name

    @property
    def data(self) -> np.ndarray:
        """Floats as their dtype in the HF shape; quantized types as (rows, bytes per row) uint8."""
        raw = self._file.read(self.offset, self.n_bytes)
        dims = tuple(reversed(self.shape))
        name = self.tensor_type.name
        if name in FLOAT_DTYPES:
            return raw.view(FLOAT_DTYPES[name]).reshape(dims)
        rows = int(np.prod(dims[:-1])) if len(dims) > 1 else 1
        return raw.reshape(rows, -1)


FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


@dataclass(slots=True)
class GGUFFile:
    """An opened GGUF model: one file, or every part of a split one (`path` its first); `metadata` maps each key to a
    plain Python value."""

    path: Path
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]
    sources: list[TensorSource] = field(default_factory=list)  # one a file
    notices: list[str] = field(default_factory=list)  # what the user should know about its files (gguf_split)
    spans: dict[str, Span] = field(default_factory=dict)  # where each metadata array lies in `path`
    skipped: frozenset[str] = frozenset()  # arrays not read (open_gguf's `skip`): absent from `metadata`
    stamp: Stamp = ()  # of its files before their header was read (file_stamp.py): what an entry made of it holds

    def close(self) -> None:
        """Closes the files (a tensor's data cannot be read after this)."""
        for source in self.sources:
            source.close()

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def tensor_names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def tensor(self, t: GGUFTensor) -> torch.Tensor:
        """One of `tensors` dequantized to fp32."""
        return _dequantize(t)


def open_gguf(path: str | Path, skip: dict[str, Span] | None = None) -> GGUFFile:
    """Opens and validates a GGUF file, or every part of the split model it is a part of (engine/loading/gguf_split.py),
    raising ModelLoadError with the reason when it cannot. The metadata arrays in `skip` are not read where they lie as
    its spans say (a vocabulary whose tokenizer is saved: engine/loading/tokenizer_cache.py)."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"Model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"Not a file: {path}")
    stamp = file_stamp(path)
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise not_gguf(path, os.fstat(f.fileno()).st_size)
    parts = read_parts(path, partial(read_header, skip=skip))  # every count and offset checked against its file
    mixed = mixed_quantization(parts)
    first = parts[0][1]
    gf = GGUFFile(path=parts[0][0], metadata=first.fields, tensors=[], notices=[mixed] if mixed else [],
                  spans=first.spans, skipped=first.skipped, stamp=stamp)
    try:
        for part, header in parts:
            gf.sources.append(TensorSource(part))
            gf.tensors += [GGUFTensor(t, gf.sources[-1]) for t in header.tensors]
    except OSError:
        gf.close()
        raise
    return gf


def _dequantize(t: GGUFTensor) -> torch.Tensor:
    qtype = t.tensor_type
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims innermost first
    try:
        arr = to_float32(qtype, t.data)
    except ModelLoadError:
        raise
    except NotImplementedError as exc:
        raise UnsupportedModelError(
            f"{t.file_name}: tensor {t.name} uses quantization type {qtype.name}, which Parley cannot read yet."
        ) from exc
    except Exception as exc:
        raise ModelLoadError(f"{t.file_name}: tensor {t.name} could not be decoded: {exc}") from exc
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(shape))
