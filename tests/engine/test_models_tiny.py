"""Our forward against transformers on tiny random models of every architecture, from HF folders and GGUF."""
import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from tests.support.engine_helpers import full_logits
from tests.support.tiny_models import ARCHS, load_hf_reference

pytestmark = pytest.mark.slow  # needs transformers


def _prompt(n: int = 21) -> list[int]:
    return torch.randint(6, 300, (n,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.fixture(scope="module")
def references(tiny_models):
    ids = _prompt()
    out = {}
    for arch in ARCHS:
        with torch.no_grad():
            out[arch] = load_hf_reference(tiny_models[arch].hf_dir)(torch.tensor([ids])).logits[0]
    return ids, out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(tiny_models, references, arch, source, layout):
    ids, want = references
    m = tiny_models[arch]
    lm = load_model(m.hf_dir if source == "hf" else m.gguf_path)
    got = full_logits(lm, ids, layout, chunk=8)  # 21 tokens in chunks of 8: crosses gemma's window of 8
    assert got.shape == want[arch].shape
    torch.testing.assert_close(got, want[arch], atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_q8_gguf_near_f32_as_llama_cpp_keeps_its_own(tiny_models, tiny_models_q8, arch):
    """A Q8_0 file's logits (its weights, the int8 activations and the fp16 cache a quantized load keeps, as llama.cpp
    does) lie as near the F32 file's as llama.cpp's own run of the two files: 4.7 % of the largest logit for llama.cpp
    on the tiny gemma3, 5.2 % for Parley on an AVX2 CPU; a wrong product or a lost row is ~100 %."""
    ids = _prompt()
    f32 = full_logits(load_model(tiny_models[arch].gguf_path), ids)
    q8 = full_logits(load_model(tiny_models_q8[arch].gguf_path), ids)
    theirs = [_llama_cpp_logits(m[arch].gguf_path, ids) for m in (tiny_models, tiny_models_q8)]
    assert (q8 - f32).abs().max() <= 1.25 * (theirs[1] - theirs[0]).abs().max()
    assert not torch.equal(q8, f32)  # the quantized weights were really used


def _llama_cpp_logits(path, ids: list[int]) -> torch.Tensor:
    import llama_cpp

    ref = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False)
    ref.eval(ids)
    return torch.tensor(ref.scores[: len(ids)])


def test_bfloat16_close_to_float32(tiny_models):
    ids = _prompt()
    f32 = full_logits(load_model(tiny_models["gemma3"].hf_dir), ids)
    bf16 = full_logits(load_model(tiny_models["gemma3"].hf_dir, LoadOptions(dtype="bfloat16")), ids)
    assert (bf16 - f32).abs().max() < 0.05 * f32.abs().max() + 0.05


def test_converted_cache_round_trip(tiny_models, tmp_path):
    path = tiny_models["gemma3"].gguf_path
    first = load_model(path, LoadOptions(cache_dir=tmp_path, weights="dequantized"))
    second = load_model(path, LoadOptions(cache_dir=tmp_path, weights="dequantized"))
    assert first.timings["from"] == "gguf" and second.timings["from"] == "converted-cache"
    ids = _prompt()
    assert torch.equal(full_logits(first, ids), full_logits(second, ids))
    assert second.tokenizer.encode("hello world") == first.tokenizer.encode("hello world")
    assert second.args == first.args


def test_quantized_load_writes_no_converted_cache(tiny_models_q8, tmp_path):
    """Repacking is fast enough that quantized loads keep no weights on disk beside the GGUF: the cache holds the
    tokenizer's entry alone (its vocabulary saved since 74069de, so a later load skips the header's strings)."""
    lm = load_model(tiny_models_q8["gemma3"].gguf_path, LoadOptions(cache_dir=tmp_path, weights="quantized"))
    assert lm.timings["from"] == "gguf" and [p.name for p in tmp_path.iterdir()] == ["tokenizers"]
