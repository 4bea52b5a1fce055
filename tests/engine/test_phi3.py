"""Phi-3 / Phi-4 (`phi3`): fused q/k/v and gate/up split at load, a sliding window on every layer, LongRoPE within
its original context; against transformers (HF folder and GGUF), llama.cpp, and quantized batched == alone."""
from __future__ import annotations

import pytest
import torch

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.loading.loader import LoadOptions, load_model
from engine.quant.weight import QuantTensor
from tests.engine.test_quantized import assert_batched_equals_alone
from tests.support.engine_helpers import full_logits
from tests.support.gguf_export import write_gguf
from tests.support.tiny_models import load_hf_reference, make_tiny_hf

pytestmark = pytest.mark.slow  # needs transformers

HEAD_HALF = 8  # tiny head_dim 16: 8 rotary frequencies
# llama.cpp rounds a context up to 256 and takes the long factors beyond the original context, as Parley does by its
# sessions' context (LoadOptions.context); transformers takes the short ones up to the original context
SHORT = LoadOptions(context=256)
LONG_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 256,
             "short_factor": [1.0 + 0.25 * i for i in range(HEAD_HALF)],
             "long_factor": [2.0 + i for i in range(HEAD_HALF)]}
ROT_HALF = 6  # Phi-4-mini rotates 3/4 of each head: 12 of the tiny head's 16 dims
PARTIAL_ROPE = LONG_ROPE | {"partial_rotary_factor": 0.75, "short_factor": LONG_ROPE["short_factor"][:ROT_HALF],
                            "long_factor": LONG_ROPE["long_factor"][:ROT_HALF]}
VARIANTS = {"window": {}, "longrope": {"sliding_window": None, "rope_parameters": LONG_ROPE,
                                       "original_max_position_embeddings": 256, "max_position_embeddings": 1024},
            "partial": {"sliding_window": None, "rope_parameters": PARTIAL_ROPE, "partial_rotary_factor": 0.75,
                        "original_max_position_embeddings": 256, "max_position_embeddings": 1024}}


@pytest.fixture(scope="module")
def phi3(tmp_path_factory) -> dict[str, tuple]:
    """variant -> (HF folder, F32 GGUF, Q8_0 GGUF, Q4_0 GGUF)."""
    root = tmp_path_factory.mktemp("phi3")
    out = {}
    for name, config in VARIANTS.items():
        hf = make_tiny_hf("phi3", root / name, config=config)
        out[name] = (hf, *(write_gguf(hf, root / f"{name}-{t}.gguf", t) for t in ("F32", "Q8_0", "Q4_0")))
    return out


def _prompt(n: int = 21) -> list[int]:
    return torch.randint(6, 300, (n,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(phi3, variant, source, layout):
    hf, f32 = phi3[variant][:2]
    ids = _prompt()
    with torch.no_grad():
        want = load_hf_reference(hf)(torch.tensor([ids])).logits[0]
    lm = load_model(hf if source == "hf" else f32, SHORT)  # 21 tokens: transformers' short factors
    assert lm.args.model_type == "phi3"
    got = full_logits(lm, ids, layout, chunk=8)  # 21 tokens in chunks of 8: crosses the window of 8
    torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-4)


def test_the_window_and_long_rope_are_read(phi3):
    window = load_model(phi3["window"][1]).args
    assert window.sliding_window == 8 and set(window.layer_types) == {"sliding"}
    for source in phi3["longrope"][:2]:
        short = load_model(source, SHORT).args  # sessions within the original context
        assert short.sliding_window is None and short.max_position_embeddings == 256
        assert short.rope["global"].factors == LONG_ROPE["short_factor"] and short.attn_factor > 1.0
        long = load_model(source).args  # the model's own context
        assert long.max_position_embeddings == 1024 and long.rope["global"].factors == LONG_ROPE["long_factor"]
        assert long.attn_factor == pytest.approx(short.attn_factor) and long.long_rope is None


@pytest.mark.parametrize("variant", ["longrope", "partial"])
@pytest.mark.parametrize("context", [256, 1024])
def test_llama_cpp_reads_the_same_model(phi3, context, variant):
    """llama.cpp's own phi3 graph on the same file gives the same logits at every position: fused rows split right,
    LongRoPE's factors (short within the original context, long beyond) and attention factor read as llama.cpp reads
    them (its f16 cache: ~1e-3). The windowed variant is not compared: llama-cpp-python 0.3 attends to every key of a
    phi3 file (checked: its logits equal the unwindowed model's), where transformers, which Parley follows, applies
    the window."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = phi3[variant][1]
    ids = _prompt()
    ref = llama_cpp.Llama(model_path=str(path), n_ctx=context, logits_all=True, verbose=False)
    ref.eval(ids)
    want = torch.tensor(ref.scores[: len(ids)])
    got = full_logits(load_model(path, LoadOptions(context=context)), ids)
    assert (got - want).abs().max() < 5e-3, (got - want).abs().max()


@pytest.mark.parametrize("variant", ["window", "partial"])  # "partial": the q/k rows reordered, quantized
@pytest.mark.parametrize("kind", [2, 3])  # Q8_0 (int8 rows) and Q4_0 (the int4 kernels) on the CPU
def test_quantized_rows_split_and_batched_equals_alone(phi3, kind, variant):
    path = phi3[variant][kind]
    lm = load_model(path, LoadOptions(weights="quantized"))
    assert any(isinstance(m, QuantTensor) for m in lm.model.modules())  # held quantized, split by rows
    exact = full_logits(load_model(path, LoadOptions(weights="dequantized")), _prompt())  # the file's fp32 values
    q = full_logits(lm, _prompt())
    assert (q - exact).abs().max() < 0.05 * exact.abs().max()
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)


def test_partial_rotary_is_read(phi3):
    """Phi-4-mini's 3/4 rotary: 12 of 16 dims a head from either source, factors for those 6 pairs, zero frequency
    for the 2 pairs left."""
    for source in phi3["partial"][:2]:
        lm = load_model(source, SHORT)
        rope = lm.args.rope["global"]
        assert rope.rotary_dim == 12 and rope.factors == PARTIAL_ROPE["short_factor"]
        inv = lm.model.rotary["global"].inv_freq
        assert inv.shape == (8,) and torch.all(inv[:ROT_HALF] > 0) and torch.equal(inv[ROT_HALF:], torch.zeros(2))


def test_partial_rotary_on_mlx(phi3):
    """MLX gets the reordered rows, the zero frequencies and the rotated dims' gain as PyTorch does."""
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(phi3["partial"][1], LoadOptions(weights="dequantized", context=256)))


@pytest.mark.parametrize("dims, words", [(11, r"rotates 69% .*\(11 dims\); a rotary embedding needs an even"),
                                         (64, "rotates 64 dims of each 16-dim attention head")])
def test_a_gguf_rotary_that_does_not_fit_is_refused_in_one_line(phi3, tmp_path, dims, words):
    from tests.support.arch_checks import assert_refused

    assert_refused(phi3["partial"][1], tmp_path, "phi3.rope.dimension_count", dims, words)


def test_an_odd_rotary_is_refused_in_one_line(tmp_path):
    hf = make_tiny_hf("phi3", tmp_path / "odd", config={"partial_rotary_factor": 0.7, "sliding_window": None})
    with pytest.raises(UnsupportedModelError, match=r"rotates 70% of each 16-dim attention head \(11 dims\)"):
        load_model(hf)


def test_q8_rows_split_like_f32(phi3):
    """Q8_0 blocks split by rows (byte offsets within the file) give the F32 file's model, up to Q8's rounding."""
    f32 = full_logits(load_model(phi3["window"][1]), _prompt())
    q8 = full_logits(load_model(phi3["window"][2], LoadOptions(weights="dequantized")), _prompt())
    assert (q8 - f32).abs().max() < 0.05 * f32.abs().max() and not torch.equal(q8, f32)


def test_a_q4_k_m_file_quantized_by_llama_cpp(tmp_path):
    """llama.cpp's own Q4_K_M mix of a phi3 file (its fused attn_qkv and ffn_up in K-quant super-blocks, some Q6_K)
    is held quantized, split by rows, near the file's exact values, batched == alone."""
    pytest.importorskip("llama_cpp")
    from bench.synthetic_gguf import quantize_mix

    hf = make_tiny_hf("phi3", tmp_path / "hf", config={"hidden_size": 256, "intermediate_size": 512,
                                                        "sliding_window": 16})
    path = tmp_path / "phi3-Q4_K_M.gguf"
    quantize_mix(write_gguf(hf, tmp_path / "phi3-f16.gguf", "F16"), path, "Q4_K_M")
    lm = load_model(path, LoadOptions(weights="quantized"))
    types = {m.source_type for m in lm.model.modules() if isinstance(m, QuantTensor)}
    assert "Q4_K" in types, types
    exact = full_logits(load_model(path, LoadOptions(weights="dequantized")), _prompt())
    q = full_logits(lm, _prompt())
    assert (q - exact).abs().max() < 0.05 * exact.abs().max()
    assert_batched_equals_alone(lm, "sequence")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kind", [2, 3])
def test_on_cuda_quantized(phi3, variant, kind):
    """The split rows in the CUDA formats (int8 rows, int4 tiles), every layer windowed or LongRoPE's scale, under
    the decode graphs: near the exact model, batched == alone in both layouts."""
    from tests.support.arch_checks import assert_on_cuda

    lm = assert_on_cuda(phi3[variant][kind], "quantized")
    assert not [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]


def test_fused_rows_that_do_not_fit_the_heads_are_refused(phi3, tmp_path):
    import gguf

    from tests.support.gguf_export import rewrite_gguf

    bad = rewrite_gguf(gguf.GGUFReader(phi3["window"][2]), tmp_path / "bad.gguf",
                       extra={"phi3.attention.head_count_kv": 1})
    with pytest.raises(ModelLoadError, match=r"bad\.gguf: tensor blk\.0\.attn_qkv\.weight .* 128 rows where the "
                                             r"model's head counts need 96"):
        load_model(bad, LoadOptions(weights="quantized"))


def test_converted_cache_keeps_long_rope_and_the_window(phi3, tmp_path):
    for variant in VARIANTS:
        path = phi3[variant][1]
        first = load_model(path, LoadOptions(cache_dir=tmp_path / variant, weights="dequantized"))
        second = load_model(path, LoadOptions(cache_dir=tmp_path / variant, weights="dequantized"))
        assert second.timings["from"] == "converted-cache" and second.args == first.args
        # the same weights; the cached copy's memory gives CPU matmuls another summation order (llama, qwen2 too)
        torch.testing.assert_close(full_logits(first, _prompt()), full_logits(second, _prompt()), atol=1e-4, rtol=0)


@pytest.mark.parametrize("sessions, factors", [(256, "short_factor"), (None, "long_factor")])
def test_the_engine_picks_long_rope_by_its_sessions_context(phi3, sessions, factors):
    from engine.runtime import EngineConfig
    from tests.support.engine_client import Client

    client = Client(EngineConfig(max_sessions=2, max_session_tokens=sessions))
    client.engine.start()
    try:
        model = client.load(phi3["longrope"][1])
        args = client.engine.loaded_model(model).args
        assert args.rope["global"].factors == LONG_ROPE[factors]
        assert args.max_position_embeddings == (sessions or 1024)
    finally:
        client.engine.shutdown()
