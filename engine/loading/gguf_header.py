"""Reading a GGUF header with every count checked.

gguf.GGUFReader trusts the counts it reads (an array length of 2**62 makes it loop and allocate per
element; absurd shapes overflow its size arithmetic) and keeps two numpy views per array item (~750 MB
for a 262k-token vocabulary). This reader walks the layout with every count checked against the bytes
actually left and against fixed caps; `scan_header` keeps the scalars and the tensor table (cheap validation),
`read_header` every value as plain Python, and the tensor table.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from engine.errors import ModelLoadError, UnsupportedModelError

MAX_STRING_BYTES = 16 << 20  # chat templates are tens of KB; nothing in a header needs more
MAX_ARRAY_ITEMS = 2_000_000  # the largest vocabularies (and merge lists) stay well below
MAX_TOTAL_ITEMS = 8_000_000
MAX_ARRAY_DEPTH = 2
MAX_TENSORS = 100_000
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 40
MAX_ALIGNMENT = 1 << 20
FIRST_READ = 1 << 20  # the header is read from the file's start in growing pieces, this much first
NEWER_TYPES_BELOW = 256  # ggml numbers its types from 0 (43 of them in 2026): a larger number is a damaged field

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class Span:
    """An array value's bytes in the file (its item type and count, then its items) and its length: a later read of
    the same file passes over it without walking its items (a 262,144-token vocabulary is ~0.3 s of Python)."""

    start: int
    end: int
    length: int


@dataclass(slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: innermost dimension first
    type_id: int
    offset: int  # from the start of the file
    n_bytes: int


@dataclass(slots=True)
class GGUFHeader:
    version: int
    scalars: dict[str, object] = field(default_factory=dict)  # every non-array field
    array_lengths: dict[str, int] = field(default_factory=dict)
    arrays: dict[str, list] = field(default_factory=dict)  # read_header only
    tensors: list[TensorInfo] = field(default_factory=list)
    n_tensors: int = 0
    spans: dict[str, Span] = field(default_factory=dict)  # each array: where its value lies in the file
    skipped: frozenset[str] = frozenset()  # arrays read_header was told to pass over: in array_lengths, not in arrays

    @property
    def fields(self) -> dict[str, object]:
        return {**self.scalars, **self.arrays}


class _Cursor:
    """Walks the header in bytes read from the file's start (never a mapping: a file cut short while it is read, by a
    copy or download over it, would kill the process with SIGBUS), checking every count against the file's size."""

    def __init__(self, file: BinaryIO, name: str):
        self.file, self.size = file, os.fstat(file.fileno()).st_size
        self.buf, self.pos, self.name, self.items = b"", 0, name, 0

    def have(self, end: int) -> bytes:
        """The bytes read so far, at least `end` of them (end <= size): the buffer at least doubles each time."""
        if end > len(self.buf):
            want = min(self.size, max(end, 2 * len(self.buf), FIRST_READ)) - len(self.buf)
            more = self.file.read(want)
            self.buf += more
            if len(more) < want:
                raise self.fail(f"it was cut short while it was read (now {len(self.buf):,} bytes)")
        return self.buf

    def fail(self, why: str) -> ModelLoadError:
        return ModelLoadError(f"{self.name} is damaged or truncated: {why} (header byte {self.pos:,}).")

    def left(self) -> int:
        return self.size - self.pos

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if size > self.left():
            raise self.fail("it ends in the middle of the header")
        (value,) = struct.unpack_from(fmt, self.have(self.pos + size), self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.take("<Q")
        if n > min(self.left(), MAX_STRING_BYTES):
            raise self.fail(f"{what} claims {n:,} bytes")
        raw = self.have(self.pos + n)[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def value(self, vtype: int, key: str, depth: int = 0, keep: bool = False):
        """A scalar or string; an array's length (or, with `keep`, its items as a list)."""
        if vtype in SCALARS:
            return self.take(SCALARS[vtype])
        if vtype == STRING:
            return self.string(f"the value of {key!r}")
        if vtype != ARRAY:
            raise self.fail(f"{key!r} has unknown value type {vtype}")
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"{key!r} nests arrays too deeply")
        itype, n = self.take("<I"), self.take("<Q")
        least = struct.calcsize(SCALARS[itype]) if itype in SCALARS else 8 if itype == STRING else 12
        if n > MAX_ARRAY_ITEMS or n * least > self.left():
            raise self.fail(f"array {key!r} claims {n:,} items")
        self.items += n
        if self.items > MAX_TOTAL_ITEMS:
            raise self.fail("its arrays hold too many items in total")
        if itype in SCALARS:  # fixed-size items: one read for all of them
            start, self.pos = self.pos, self.pos + n * least
            if not keep:
                return n
            values = np.frombuffer(self.have(self.pos), dtype=np.dtype(SCALARS[itype]), count=n, offset=start)
            return [bool(v) for v in values] if itype == 7 else values.tolist()
        if itype == STRING:
            items = self.strings(n, f"an item of {key!r}")
        else:
            items = [self.value(itype, key, depth + 1, keep) for _ in range(n)]
        return items if keep else n

    def strings(self, n: int, what: str) -> list[str]:
        """`n` strings in a row, each checked as `string` checks one, in one loop (a vocabulary holds 262,144: per-item
        calls made this most of a second of every load)."""
        buf, pos, end, out = self.buf, self.pos, self.size, []
        try:
            for _ in range(n):
                if end - pos < 8:
                    raise self.fail("it ends in the middle of the header")
                if pos + 8 > len(buf):
                    buf = self.have(pos + 8)
                (size,) = _U64.unpack_from(buf, pos)
                pos += 8
                if size > min(end - pos, MAX_STRING_BYTES):
                    raise self.fail(f"{what} claims {size:,} bytes")
                if pos + size > len(buf):
                    buf = self.have(pos + size)
                out.append(buf[pos:pos + size].decode("utf-8"))
                pos += size
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None
        finally:
            self.pos = pos
        return out


def scan_header(path: str | Path, skip: dict[str, Span] | None = None) -> GGUFHeader:
    """The scalars, array lengths and tensor table; raises ModelLoadError when any count, length, shape or offset in the header
    is impossible. The arrays in `skip` are passed over as read_header passes over them."""
    return _read(Path(path), keep=False, skip=skip)


def read_header(path: str | Path, skip: dict[str, Span] | None = None) -> GGUFHeader:
    """Every metadata value (arrays as lists) and the tensor table, checked as scan_header checks; the arrays named in
    `skip` (spans an earlier read of this file gave) are passed over where they lie there, their lengths kept."""
    return _read(Path(path), keep=True, skip=skip)


def not_gguf(path: Path, size: int) -> ModelLoadError:
    """The error for a file of `size` bytes that does not begin with GGUF's signature, in the words that help: an empty
    one was never written (a copy or download that did not finish), a Hugging Face folder's file names its folder."""
    if size == 0:
        return ModelLoadError(f"{path.name} is empty (0 bytes), not a GGUF model file: a copy or download of it that "
                              "did not finish?")
    if path.suffix.lower() in (".safetensors", ".json") and (path.parent / "config.json").is_file():
        return ModelLoadError(f"{path.name} is not a GGUF model file but a file of the Hugging Face model folder "
                              f"{path.parent}: load the folder.")
    return ModelLoadError(f"{path.name} is not a GGUF model file: it does not begin with GGUF's signature.")


def _read(path: Path, keep: bool, skip: dict[str, Span] | None = None) -> GGUFHeader:
    import gguf

    skip = skip or {}
    with path.open("rb") as f:
        c = _Cursor(f, path.name)
        if c.size < 4 or c.take("<4s") != b"GGUF":  # a text file or another format: not a damaged model, none at all
            raise not_gguf(path, c.size)
        header = GGUFHeader(version=c.take("<I"))
        if header.version not in (2, 3):
            raise c.fail(f"unsupported GGUF version {header.version}")
        n_tensors, n_kv = c.take("<Q"), c.take("<Q")
        if n_kv * 13 > c.left():
            raise c.fail(f"it claims {n_kv:,} metadata fields")
        if n_tensors > MAX_TENSORS or n_tensors * 24 > c.left():
            raise c.fail(f"it claims {n_tensors:,} tensors")
        for _ in range(n_kv):
            key = c.string("a metadata key")
            _read_field(c, header, key, c.take("<I"), keep, skip)
        alignment = header.scalars.get("general.alignment", 32)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
            raise c.fail(f"alignment {alignment!r} is not a power of two")
        if alignment > MAX_ALIGNMENT:
            raise c.fail(f"alignment {alignment:,} is larger than {MAX_ALIGNMENT:,} bytes")
        tensors = [_tensor_info(c, gguf) for _ in range(n_tensors)]
        data_start = -(-c.pos // alignment) * alignment
        for t in tensors:
            if t.offset > c.size or data_start + t.offset + t.n_bytes > c.size:
                raise c.fail(f"tensor {t.name} lies outside the file (offset {t.offset:,}, {t.n_bytes:,} bytes)")
            if t.offset % alignment:
                raise c.fail(f"tensor {t.name} starts at {t.offset:,}, not a multiple of the alignment {alignment}")
            t.offset += data_start
        _check_layout(c, tensors, data_start, alignment)
        header.n_tensors = n_tensors
        header.tensors = tensors
        return header


def _read_field(c: _Cursor, header: GGUFHeader, key: str, vtype: int, keep: bool, skip: dict[str, Span]) -> None:
    """One metadata value into `header`; an array of `skip` found where its span says is passed over."""
    start = c.pos
    if vtype != ARRAY:
        header.scalars[key] = c.value(vtype, key)
        return
    if _passes_over(c, skip.get(key)):
        header.array_lengths[key] = skip[key].length
        header.skipped |= {key}
    else:
        value = c.value(vtype, key, keep=keep)
        header.array_lengths[key] = len(value) if keep else value
        if keep:
            header.arrays[key] = value
    header.spans[key] = Span(start, c.pos, header.array_lengths[key])


def _passes_over(c: _Cursor, span: Span | None) -> bool:
    """Moves past an array the span says lies here, with the item count it gave; False (nothing read) otherwise."""
    if span is None or span.start != c.pos or not c.pos + 12 <= span.end <= c.size:
        return False
    (n,) = _U64.unpack_from(c.have(c.pos + 12), c.pos + 4)  # after the item type
    if n != span.length:
        return False
    c.pos, c.items = span.end, c.items + n  # its count was checked when the span was read
    return True


def _check_layout(c: _Cursor, tensors: list[TensorInfo], data_start: int, alignment: int) -> None:
    """Tensors tile the data section: each starts where the one before ends, give or take alignment padding. A shape
    or type that claims more bytes than stored runs into the next tensor; one that claims fewer leaves a gap."""
    ordered = sorted(tensors, key=lambda t: t.offset)
    end = data_start
    for t in ordered:
        if t.offset < end:
            before = next(b for b in ordered if b.offset < end and b.offset + b.n_bytes == end)
            raise c.fail(f"tensor {before.name} ({before.n_bytes:,} bytes for shape {list(before.shape)}) overlaps "
                         f"tensor {t.name}")
        if t.offset - end >= alignment:
            raise c.fail(f"{t.offset - end:,} unused bytes lie before tensor {t.name} (a changed shape or type?)")
        end = t.offset + t.n_bytes
    if ordered and c.size - end >= alignment:
        raise c.fail(f"{c.size - end:,} unused bytes follow the last tensor, {ordered[-1].name} "
                     "(a changed shape or type?)")


def _tensor_info(c: _Cursor, gguf) -> TensorInfo:
    name = c.string("a tensor name")
    if not name.isprintable():  # names are printed in errors: an escape sequence must not reach a terminal
        raise c.fail(f"tensor name {name!r} holds control characters")
    n_dims = c.take("<I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise c.fail(f"tensor {name} has {n_dims:,} dimensions")
    dims = [c.take("<Q") for _ in range(n_dims)]
    qtype, offset = c.take("<I"), c.take("<Q")
    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        if qtype < NEWER_TYPES_BELOW:  # llama.cpp adds types (Q2_0 is 42): a newer file, not a damaged one
            raise UnsupportedModelError(f"{c.name}: tensor {name} uses GGML type {qtype}, which this Parley does not "
                                        "know (a newer llama.cpp quantization): it cannot read it yet.") from None
        raise c.fail(f"tensor {name} has unknown type {qtype}") from None
    n = 1
    for d in dims:
        n *= d
    if any(d == 0 for d in dims) or n > MAX_ELEMENTS or n % block:
        raise c.fail(f"tensor {name} has impossible shape {dims}")
    return TensorInfo(name, tuple(dims), qtype, offset, n * type_size // block)
