"""A GGUF file written again as a split model, as llama.cpp's gguf-split writes one (gguf.GGUFWriter's
split_max_tensors: NAME-00001-of-0000N.gguf, every part with split.no / split.count / split.tensors.count)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def split_gguf(src: Path, out: Path, max_tensors: int) -> list[Path]:
    """`src` split into parts of at most `max_tensors` tensors beside `out` (NAME.gguf -> NAME-0000i-of-0000N.gguf)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(src)
    writer = GGUFWriter(out, reader.fields["general.architecture"].contents(), split_max_tensors=max_tensors)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=np.array(t.data.shape), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    return sorted(out.parent.glob(f"{out.stem}-*-of-*.gguf"))
