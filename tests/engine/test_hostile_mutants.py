"""A seeded sample of byte-level GGUF mutants (stop 78's sweep, /tmp/sweepBD/harness.py there, ran ~1,200 of them):
cuts at any offset and header fields overwritten in place each end in one clear line or a load, within the bounds of
test_hostile_gguf.load_bounded. The Layout rewriter there changes values; these change the bytes a writer wrote."""
from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest

from engine.errors import ParleyError
from tests.engine.test_hostile_gguf import load_bounded

SEED = 78
Mutant = tuple[str, int, bytes | None]  # (what, offset, bytes written there); None: the file cut at the offset


def _starts(field) -> list[int]:
    """Where each of a reader field's parts begins in the file."""
    out, at = [], field.offset
    for part in field.parts:
        out.append(at)
        at += part.nbytes
    return out


def _regions(reader: gguf.GGUFReader) -> dict[str, tuple[int, int]]:
    kv_end = reader.tensors[0].field.offset
    return {"header": (0, 24), "metadata": (24, kv_end), "tensor table": (kv_end, reader.data_offset),
            "data": (reader.data_offset, len(reader.data))}


def _cuts(reader: gguf.GGUFReader, rng: random.Random) -> Iterator[Mutant]:
    for region, (start, end) in _regions(reader).items():
        for at in rng.sample(range(start, end), 3):
            yield f"cut in the {region} at {at}", at, None


def _header(reader: gguf.GGUFReader, rng: random.Random) -> Iterator[Mutant]:
    n_tensors, n_kv = len(reader.tensors), len(reader.fields) - 3  # the reader adds GGUF.version and the counts
    yield "version 4", 4, struct.pack("<I", 4)
    for n in (0, n_tensors + 1, 2**40):
        yield f"tensor count {n}", 8, struct.pack("<Q", n)
    for n in (0, n_kv + 1, 2**40):
        yield f"metadata count {n}", 16, struct.pack("<Q", n)


def _metadata(reader: gguf.GGUFReader, rng: random.Random) -> Iterator[Mutant]:
    fields = [f for k, f in reader.fields.items() if not k.startswith("GGUF.")]
    for f in rng.sample(fields, 3):
        key_length, _, value_type = _starts(f)[:3]
        yield f"{f.name}'s key length 2**40", key_length, struct.pack("<Q", 2**40)
        yield f"{f.name}'s type 13", value_type, struct.pack("<I", 13)
        yield f"{f.name}'s type 9 (an array)", value_type, struct.pack("<I", 9)
    strings = [f for f in fields if f.types == [gguf.GGUFValueType.STRING]]
    for f in rng.sample(strings, 2):
        yield f"{f.name}'s length past the end", _starts(f)[3], struct.pack("<Q", len(reader.data))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    yield "2**40 tokens", _starts(tokens)[4], struct.pack("<Q", 2**40)
    yield "tokens of item type 99", _starts(tokens)[3], struct.pack("<I", 99)


def _tensor_table(reader: gguf.GGUFReader, rng: random.Random) -> Iterator[Mutant]:
    for t in rng.sample(list(reader.tensors), 2):
        _, _, n_dims, dims, qtype, offset = _starts(t.field)
        yield from ((f"{t.name} of type {v}", qtype, struct.pack("<I", v)) for v in (43, 255, 2**31))
        yield from ((f"{t.name} of {v} dims", n_dims, struct.pack("<I", v)) for v in (0, 5))
        yield from ((f"{t.name}'s first dim {v}", dims, struct.pack("<Q", v)) for v in (0, 2**63))
        data_offset = int(t.field.parts[-1][0])
        yield from ((f"{t.name} at {v}", offset, struct.pack("<Q", v)) for v in (len(reader.data), data_offset + 1))


def _write(source: Path, mutant: Mutant, out: Path) -> Path:
    _, at, data = mutant
    blob = source.read_bytes()
    out.write_bytes(blob[:at] if data is None else blob[:at] + data + blob[at + len(data):])
    return out


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("kind", [_cuts, _header, _metadata, _tensor_table], ids=lambda k: k.__name__.strip("_"))
def test_byte_mutants_end_in_one_clear_line_or_a_load(tiny_models, tmp_path, arch, kind):
    source = tiny_models[arch].gguf_path
    reader = gguf.GGUFReader(source)
    mutants = list(kind(reader, random.Random(f"{SEED}-{arch}-{kind.__name__}")))
    del reader  # its mapping of the file
    failures = []
    for mutant in mutants:
        try:
            load_bounded(_write(source, mutant, tmp_path / "m.gguf"))  # asserts the bounds and a one-line error
        except (AssertionError, Exception) as exc:  # noqa: BLE001 - every mutant is tried, all failures listed
            failures.append(f"{mutant[0]}: {type(exc).__name__}: {exc}"[:300])
    assert not failures, "\n".join(failures)


def test_a_cut_inside_the_data_names_the_tensor_that_lies_outside_the_file(tiny_models, tmp_path):
    source = tiny_models["llama"].gguf_path
    size = source.stat().st_size
    result = load_bounded(_write(source, ("cut", size - 100, None), tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and "lies outside the file" in str(result), result
