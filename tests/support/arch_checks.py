"""The checks every architecture's tiny model goes through (tests/engine/test_<arch>.py): logits against transformers
and llama.cpp, quantized weights near the exact model with greedy batched == alone, and the CUDA path."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.loading.loader import LoadOptions, load_model
from engine.quant.weight import QuantTensor
from tests.engine.test_quantized import _last_logits, assert_batched_equals_alone
from tests.support.engine_helpers import full_logits
from tests.support.gguf_export import write_gguf
from tests.support.tiny_models import load_hf_reference, make_tiny_hf

TYPES = ("F32", "Q8_0", "Q4_0")  # the exact file, int8 rows, the int4 kernels


def tiny_files(root: Path, arch: str, config: dict | None = None) -> tuple[Path, ...]:
    """(HF folder, F32 GGUF, Q8_0 GGUF, Q4_0 GGUF) of a tiny `arch` model."""
    hf = make_tiny_hf(arch, root / "hf", config=config)
    return (hf, *(write_gguf(hf, root / f"{arch}-{t}.gguf", t) for t in TYPES))


def prompt(n: int = 21) -> list[int]:
    return torch.randint(6, 300, (n,), generator=torch.Generator().manual_seed(1)).tolist()


def assert_matches_transformers(hf: Path, source: Path, layout: str, options: LoadOptions | None = None):
    """`source` (the HF folder or a GGUF of it) gives transformers' logits at every position, prefilled in chunks of 8
    (past a tiny sliding window)."""
    ids = prompt()
    with torch.no_grad():
        want = load_hf_reference(hf)(torch.tensor([ids])).logits[0]
    lm = load_model(source, options or LoadOptions())
    torch.testing.assert_close(full_logits(lm, ids, layout, chunk=8), want, atol=5e-5, rtol=1e-4)
    return lm


def against_llama_cpp(path: Path, context: int = 256, options: LoadOptions | None = None, f32_cache: bool = False):
    """(Parley's logits, llama.cpp's) at every position of the same file, from llama.cpp's own graph (its f16 cache
    leaves them ~1e-3 apart; `f32_cache` keeps llama.cpp's cache fp32, as Parley's dequantized one)."""
    import llama_cpp

    ids = prompt()
    kw = dict(type_k=0, type_v=0) if f32_cache else {}  # GGML_TYPE_F32
    ref = llama_cpp.Llama(model_path=str(path), n_ctx=context, logits_all=True, verbose=False, **kw)
    ref.eval(ids)
    want = torch.tensor(ref.scores[: len(ids)])
    return full_logits(load_model(path, options or LoadOptions(context=context)), ids), want


def assert_quantized_near_exact_and_invariant(path: Path) -> None:
    """Held quantized on the CPU, near the file's exact values; greedy batched == alone in both layouts."""
    lm = load_model(path, LoadOptions(weights="quantized"))
    assert any(isinstance(m, QuantTensor) for m in lm.model.modules())
    exact = full_logits(load_model(path, LoadOptions(weights="dequantized")), prompt())
    q = full_logits(lm, prompt())
    # the weights' quantization and the fp16 KV cache quantized loads keep (as llama.cpp): 2-5.3 % on the tiny models
    # here (2-4.4 % with an fp32 cache); a wrong product or lost row is ~100 %
    assert (q - exact).abs().max() < 0.065 * exact.abs().max()
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)


def assert_refused(good: Path, tmp: Path, key: str, value, words: str) -> None:
    """The file with one metadata field changed is refused in one clear line naming what is wrong."""
    import gguf
    import pytest

    from engine.errors import UnsupportedModelError
    from tests.support.gguf_export import rewrite_gguf

    bad = rewrite_gguf(gguf.GGUFReader(good), tmp / "bad.gguf", extra={key: value})
    with pytest.raises(UnsupportedModelError, match=words):
        load_model(bad)


def assert_on_cuda(path: Path, weights: str):
    """bf16 on CUDA under the decode graphs, near the exact model; greedy batched == alone in both layouts. Returns
    the CUDA model."""
    lm = load_model(path, LoadOptions(device="cuda", dtype="bfloat16", weights=weights))
    exact = load_model(path, LoadOptions(weights="dequantized"))
    ids = torch.randint(6, lm.args.vocab_size, (24,), generator=torch.Generator().manual_seed(5))
    got, want = _last_logits(lm, ids).float().cpu(), _last_logits(exact, ids)
    assert (got - want).abs().max() < 0.08 * want.abs().max()
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)
    return lm
