"""A quantized GGUF tensor decoded to fp32 holds little more than its result: gguf's numpy decoding of the whole
tensor at once held about three fp32 copies, uncounted by the memory estimate (the embedded model's Q8_0 embedding
under --weights dequantized: 1,832 MB peak resident for the load, and a SIGSEGV inside numpy under ulimit -v 2,300)."""
from __future__ import annotations

import tracemalloc

import gguf
import numpy as np

from engine.quant import gguf_blocks


def test_a_quantized_tensor_decodes_in_little_more_than_its_result(monkeypatch):
    monkeypatch.setattr(gguf_blocks, "ROW_SLICE_BYTES", 256 << 10)
    weights = np.random.default_rng(0).standard_normal((1024, 2048), dtype=np.float32)
    raw = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)  # (rows, bytes a row)
    tracemalloc.start()
    try:
        out = gguf_blocks.to_float32(gguf.GGMLQuantizationType.Q8_0, raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(out, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0))
    assert peak < 1.25 * out.nbytes, f"{peak / out.nbytes:.2f}x the result"
