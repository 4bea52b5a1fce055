"""Models that come as several GGUF files, as llama.cpp's gguf-split writes them: NAME-00001-of-00003.gguf holds the
metadata and some tensors, each later part more tensors, and every part carries split.no, split.count and
split.tensors.count. Any part names the whole model (as the folder holding one model's files does); every part is
checked against the first before a weight is read, so a missing, foreign or cut-short part is one line naming it.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import gguf
from typing import Callable, NoReturn

from engine.errors import ModelLoadError
from engine.loading.gguf_header import GGUFHeader

SHARD_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)  # llama.cpp's "%s-%05d-of-%05d.gguf"
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
MAX_NAME_CHARS = 256  # a model's own name longer than this is not shown (the file's name is)


def shard_of(path: Path) -> tuple[int, int] | None:
    """(part, parts), counted from 1, that the file's name gives; None for a name without them."""
    m = SHARD_NAME.search(path.name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def shard_path(path: Path, no: int, count: int) -> Path:
    """Part `no` (from 1) of `count` beside `path`, a part of the same split."""
    m = SHARD_NAME.search(path.name)
    return path.with_name(f"{path.name[:m.start()]}-{no:05d}-of-{count:05d}{path.suffix}")  # .gguf or .GGUF


def first_part(path: Path) -> Path:
    """The first part of the split a file's name says it belongs to (the file itself otherwise)."""
    shard = shard_of(path)
    return path if shard is None or shard[0] == 1 else shard_path(path, 1, shard[1])


def model_files(path: Path) -> list[Path]:
    """Every file on disk a model occupies (its size, its identity): a split's parts that exist, by their names; a
    folder's files; else the file."""
    if path.is_dir():
        return sorted(f for f in path.iterdir() if f.is_file())
    shard = shard_of(path)
    if shard is None:
        return [path]
    parts = [shard_path(path, i, shard[1]) for i in range(1, shard[1] + 1)]
    return [p for p in parts if p.is_file()] or [path]


def model_name(path: Path) -> str:
    """A model file's name without .gguf and without a split's part number."""
    m = SHARD_NAME.search(path.name)
    return path.name[:m.start()] if m else path.stem


def shown_name(own: str, path: Path) -> str:
    """The name a model goes by: its own (a GGUF's general.name, a folder's name) where that is one line of sensible
    length, else `model_name` (a 1 MB general.name, or one holding escape sequences, is not shown)."""
    return own if 0 < len(own) <= MAX_NAME_CHARS and own.isprintable() else model_name(path)


def files_name(path: Path) -> str:
    """A model file's name as a message names the whole model: a split's name and its parts, the file's otherwise."""
    files = model_files(path)
    if len(files) == 1:
        return path.name
    return f"{model_name(path)} ({len(files)} files: {files[0].name} to {files[-1].name})"


def gguf_in_folder(folder: Path) -> Path | None:
    """The first file of the one GGUF model a folder holds (a file, or one split's parts); None when it holds no
    .gguf file; ModelLoadError naming them when it holds several models."""
    files = sorted(f for f in folder.glob("*") if f.suffix.lower() == ".gguf" and f.is_file())
    models = sorted({first_part(f) for f in files})
    if len(models) > 1:
        names = ", ".join(m.name for m in models[:4]) + (" …" if len(models) > 4 else "")
        raise ModelLoadError(f"{folder} holds {len(models)} GGUF models ({names}): choose one of the files.")
    return models[0] if models else None


def model_file(source: Path) -> Path:
    """What loads for `source`: a split model's first part for any of its parts (one model, one converted copy,
    whichever part was named); for a folder that holds one GGUF model (a file, or a split model's parts: Hugging Face
    repos keep each quantization's parts in a folder of their own) and no safetensors weights, its first file (GGUF
    repos often carry the original config.json beside their files)."""
    if source.is_dir() and not any(source.glob("*.safetensors")):
        return gguf_in_folder(source) or source
    first = first_part(source)
    return first if first.is_file() else source


def read_parts(path: Path, read: Callable[[Path], GGUFHeader], later: Path | None = None) -> list[tuple[Path, GGUFHeader]]:
    """(file, header) of every part of the model `path` belongs to, the first first; one part for a file that is not
    split. `read` reads one header (gguf_header.scan_header or read_header). Raises ModelLoadError naming the file
    that is missing, damaged, or from another split or model."""
    header = read(path)
    no, count = header.scalars.get("split.no", 0), header.scalars.get("split.count", 1)
    if not all(type(v) is int for v in (no, count)) or not 0 <= no < count:
        raise ModelLoadError(f"{path.name} is damaged: it says it is part {no!r} (from 0) of a split in {count!r}.")
    if no > 0 and later is not None:
        raise ModelLoadError(f"{path.name} says it is part {no + 1} of {count}, not the first part {later.name} needs.")
    if no > 0:  # a later part (`later`): the model loads from its first, as llama.cpp's does
        first = _named_part(path, 1, header, f"{path.name} is part {no + 1} of a split model")
        if not first.is_file():
            _missing(path, first, 1, header)
        return read_parts(first, read, path)
    if count == 1:
        _check_whole(path, header)
        return [(path, header)]
    parts = [(path, header)]
    for i in range(2, count + 1):
        part = _named_part(path, i, header, f"{path.name} is part 1 of a model split in {count} files")
        if not part.is_file():
            _missing(path, part, i, header)
        parts.append((part, _checked(part, read(part), i, parts)))
    _check_total(parts)
    return parts


def merged(parts: list[tuple[Path, GGUFHeader]]) -> GGUFHeader:
    """One header for the whole model: the first part's metadata, every part's tensors."""
    first = parts[0][1]
    if len(parts) == 1:
        return first
    tensors = [t for _, h in parts for t in h.tensors]
    return GGUFHeader(first.version, first.scalars, first.array_lengths, first.arrays, tensors, len(tensors))


def _check_whole(path: Path, header: GGUFHeader) -> None:
    """A file that holds a whole model but is named as a split's part, beside the split's other parts: those parts
    would go unread, and the model the user meant is not this file."""
    shard = shard_of(path)
    others = [p.name for p in model_files(path) if p != path] if shard and shard[1] > 1 else []
    said = "its split.count is 1" if "split.count" in header.scalars else "it has no split keys"
    if others:
        raise ModelLoadError(f"{path.name} holds a whole model ({said}), but its name makes it part "
                             f"{shard[0]} of {shard[1]} beside {', '.join(others)}: a file of another download. Put "
                             "the split's own part there, or rename the whole file.")


def _named_part(path: Path, no: int, header: GGUFHeader, what: str) -> Path:
    count = header.scalars.get("split.count")
    if shard_of(path) is None or shard_of(path)[1] != count:
        raise ModelLoadError(f"{what}, but its name does not end in -NNNNN-of-{count:05d}.gguf as gguf-split names "
                             "the parts, so the others cannot be found: give them back their names.")
    return shard_path(path, no, count)


def _missing(path: Path, part: Path, no: int, header: GGUFHeader) -> NoReturn:
    count = header.scalars.get("split.count")
    raise ModelLoadError(f"{part.name} is missing: it is part {no} of the {count} files of the model {path.name} "
                         "belongs to, and every part must lie in the same folder.")


def _checked(part: Path, header: GGUFHeader, no: int, parts: list[tuple[Path, GGUFHeader]]) -> GGUFHeader:
    """A later part's header, after checking it belongs to the same split as the first."""
    first, head = parts[0]
    want = (no - 1, head.scalars["split.count"], head.scalars.get("split.tensors.count"))
    got = tuple(header.scalars.get(k) for k in SPLIT_KEYS)
    if got[0] is None:
        raise ModelLoadError(f"{part.name} is not a part of a split model (it has no split.no), but {first.name} "
                             f"needs it as part {no} of {want[1]}.")
    arch = header.scalars.get("general.architecture")
    if got != want or arch not in (None, head.scalars.get("general.architecture")):
        raise ModelLoadError(f"{part.name} does not belong with {first.name}: it is part {got[0] + 1} of "
                             f"{got[1]} of a split of {got[2]} tensors, not part {no} of {want[1]} of {want[2]} "
                             "(a file of another model or of another split).")
    seen = {t.name: p for p, h in parts for t in h.tensors}
    for t in header.tensors:
        if t.name in seen:
            raise ModelLoadError(f"{part.name} holds tensor {t.name}, which {seen[t.name].name} holds too: the "
                                 "parts come from different splits.")
    return header


def _layer_matrices(header: GGUFHeader) -> list[tuple[str, int]]:
    """(name without its layer, as "attn_q.weight"; type) of every layer matrix of a part."""
    return [(t.name.split(".", 2)[2], t.type_id) for t in header.tensors if t.name.startswith("blk.") and len(t.shape) > 1]


def mixed_quantization(parts: list[tuple[Path, GGUFHeader]]) -> str | None:
    """A notice where a part seems to come from another quantization of the model (a Q8_0 file's part 2 beside a
    Q4_K_M one's part 1, the same split): most of its layer matrices take a type the same matrix of no earlier layer
    has, where a recipe varies a matrix's type by layer for a few layers, not most (llama.cpp's Q4_K_M: some attn_v,
    ffn_down). Not refused: the same model's weights in two precisions load and answer, only not as the user chose."""
    earlier: dict[str, set[int]] = {}
    for i, (part, header) in enumerate(parts):
        if i > 0 and (said := _another_quantization(part, header, parts[0][0], earlier)):
            return said
        for role, type_id in _layer_matrices(header):
            earlier.setdefault(role, set()).add(type_id)
    return None


def _another_quantization(part: Path, header: GGUFHeader, first: Path, earlier: dict[str, set[int]]) -> str | None:
    mine = [(role, type_id) for role, type_id in _layer_matrices(header) if role in earlier]
    new = [(role, type_id) for role, type_id in mine if type_id not in earlier[role]]
    if 2 * len(new) <= len(mine):
        return None
    role, type_id = Counter(new).most_common(1)[0][0]
    return (f"{part.name} seems to come from another quantization of the model than {first.name}: {len(new)} of its "
            f"{len(mine)} layer matrices take a type no earlier layer's has ({role} {_names({type_id})}, the earlier "
            f"parts' {_names(earlier[role])}). It loads as a mix of both; put the split's own part there if that is "
            "not what you meant.")


def _names(types: set[int]) -> str:
    return "/".join(sorted(gguf.GGMLQuantizationType(t).name for t in types))


def _check_total(parts: list[tuple[Path, GGUFHeader]]) -> None:
    total = parts[0][1].scalars.get("split.tensors.count")
    found = sum(h.n_tensors for _, h in parts)
    if total is not None and found != total:
        raise ModelLoadError(f"The {len(parts)} parts of {parts[0][0].name} hold {found} tensors; the split says "
                             f"{total}: a part comes from another split.")
