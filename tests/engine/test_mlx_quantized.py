"""Quantized models on MLX: every matrix held in MLX's quantized format with the torch CPU format's weights exactly,
logits against the torch paths, batch invariance, the model held quantized and the torch copy released."""
import dataclasses
import gc
import weakref

import numpy as np
import pytest
import torch

from bench.runs import make_batcher, make_runtime
from engine import events as ev
from engine.errors import ModelLoadError
from engine.loading.loader import build_model, load_model
from engine.models.kernel_choice import KernelChoice
from engine.models.layers import QuantEmbedding, QuantLinear
from engine.quant.gguf_blocks import Int4Groups
from engine.quant.block_codes import SUPER
from engine.quant.weight import BlockRows, Int8Rows, _int4_block, bf16_tensor, pack_int4, superblocks
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.engine.test_mlx_backend import ARRIVALS, _logits, _prompts, _run
from tests.support.engine_client import Client
from tests.support.engine_helpers import run_staggered
from tests.support.tiny_models import ARCHS

mx = pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from engine.mlx_backend.quantized import convert, from_torch_quantized  # noqa: E402

QUANTS = ("q4", "q8")


@pytest.fixture(autouse=True)
def apple_cpu_formats(monkeypatch):
    """Models load as on an Apple CPU, where the x86 block kernel never builds: torch's int4/int8 formats."""
    from engine.quant import weight

    monkeypatch.setattr(weight, "blocks_available", lambda: False)


@pytest.fixture
def ggufs(tiny_models_q4, tiny_models_q8):
    return {"q4": tiny_models_q4, "q8": tiny_models_q8}


def _submodule(model, path: str):
    for part in path.split("."):
        model = model[int(part)] if isinstance(model, list) else getattr(model, part)
    return model


def _dequantized(module) -> np.ndarray:
    """What MLX multiplies by, in fp32: the stored scales/biases widened (exact) before dequantizing, since
    mx.dequantize rounds its result to the scales' dtype."""
    if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        return np.array(mx.dequantize(module.weight, module.scales.astype(mx.float32),
                                      module.biases.astype(mx.float32), group_size=module.group_size,
                                      bits=module.bits))
    return np.array(module.weight.astype(mx.float32))


def _quant_modules(torch_model):
    return [(p, m) for p, m in torch_model.named_modules() if isinstance(m, (QuantLinear, QuantEmbedding))]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("quant", QUANTS)
def test_every_matrix_dequantizes_exactly(ggufs, quant, arch):
    lm = load_model(ggufs[quant][arch].gguf_path)
    model = from_torch_quantized(lm.args, lm.model, "float32")
    assert model.conversion.inexact_groups == 0 and model.conversion.fp32_scales == 0  # Q4_0 / Q8_0: bf16 scales
    _assert_exact(lm, model)


def _assert_exact(lm, model) -> None:
    matrices = _quant_modules(lm.model)
    assert matrices
    for path, tm in matrices:
        mm = _submodule(model, path)
        assert isinstance(mm, nn.QuantizedEmbedding if isinstance(tm, QuantEmbedding) else nn.QuantizedLinear), path
        assert mm.bits == {"int4": 4, "int8": 8}[tm.qweight.format], path
        np.testing.assert_array_equal(_dequantized(mm), tm.qweight.dequantize().numpy(), err_msg=path)
        if isinstance(tm, QuantLinear) and tm.bias is not None:
            np.testing.assert_array_equal(np.array(mm.bias), tm.bias.numpy(), err_msg=path)


def _int4(n: int, k: int, zero: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    scale = torch.from_numpy(rng.uniform(1e-3, 2e-2, (n, k // 32)).astype(np.float32)).bfloat16().float().numpy()
    z = {"q4_0": np.zeros_like(scale), "q4_k": rng.normal(0, 0.05, scale.shape).astype(np.float32)}[zero]
    z = torch.from_numpy(z).bfloat16().float().numpy()
    codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
    return pack_int4(Int4Groups(codes, scale, z), zero.upper())


def _int8(n: int, k: int, seed: int = 0):
    rows = Int8Rows(n, k)
    rows.put(0, np.random.default_rng(seed).normal(0, 0.05, (n, k)).astype(np.float32))
    return rows.done("Q6_K")


@pytest.mark.parametrize("case", ["int4 zero 0", "int4 zeros", "int8 k96", "int8 k192", "int8 k256", "bf16"])
def test_formats_convert_exactly(case):
    """Beyond Q4_0/Q8_0: int4 with nonzero zeros (Q4_1/Q4_K: biases need fp32), each int8 group size, bf16; and
    quantized_matmul on fp32 activations multiplies by exactly those weights."""
    block = _int4_block()
    qt = {"int4 zero 0": lambda: _int4(2 * block, 96, "q4_0"), "int4 zeros": lambda: _int4(2 * block, 96, "q4_k"),
          "int8 k96": lambda: _int8(40, 96), "int8 k192": lambda: _int8(40, 192), "int8 k256": lambda: _int8(40, 256),
          "bf16": lambda: bf16_tensor(torch.randn(40, 48) * 0.05, "F16")}[case]()
    m = convert(qt)
    ref = qt.dequantize().numpy()
    if m.bits is None:
        got = np.array(m.weight.astype(mx.float32))
        assert m.weight.dtype == mx.bfloat16
    else:
        got = np.array(mx.dequantize(m.weight, m.scales.astype(mx.float32), m.biases.astype(mx.float32),
                                     group_size=m.group_size, bits=m.bits))
        assert m.group_size == {"int4 zero 0": 32, "int4 zeros": 32, "int8 k96": 32, "int8 k192": 64,
                                "int8 k256": 128}[case]
        assert m.scales.dtype == (mx.float32 if case == "int4 zeros" else mx.bfloat16)
        assert m.inexact == 0
    np.testing.assert_array_equal(got, ref)
    x = np.random.default_rng(1).normal(0, 1, (5, ref.shape[1])).astype(np.float32)
    if m.bits is None:
        y = mx.array(x) @ m.weight.T
    else:
        y = mx.quantized_matmul(mx.array(x), m.weight, m.scales, m.biases, transpose=True,
                                group_size=m.group_size, bits=m.bits)
    assert y.dtype == mx.float32
    np.testing.assert_allclose(np.array(y), x.astype(np.float64) @ ref.T.astype(np.float64), rtol=0, atol=1e-5)


def test_a_bias_fp32_cannot_hold_is_counted():
    n, k = _int4_block(), 32
    scale = np.full((n, 1), 2.0 ** -30, dtype=np.float32)
    zero = np.ones((n, 1), dtype=np.float32)  # bias 1 - 2^-27 needs 28 bits
    m = convert(pack_int4(Int4Groups(np.zeros((n, k), np.uint8), scale, zero), "Q4_K"))
    assert m.inexact == n and m.scales.dtype == mx.float32


@pytest.mark.parametrize("quant,arch", [("q8", "llama"), ("q4", "qwen3"), ("q4", "llama")])
def test_fused_projections_convert_to_the_same_model(ggufs, quant, arch):
    """A torch runner fuses q/k/v and gate/up in place; converting afterwards splits them back to the same arrays."""
    plain, fused = (load_model(ggufs[quant][arch].gguf_path) for _ in range(2))
    fused.model.prepare(KernelChoice(fuse_projections=True))
    assert any(n.endswith(("qkv_proj", "gate_up_proj")) for n, _ in _quant_modules(fused.model))
    a = tree_flatten(from_torch_quantized(plain.args, plain.model, "float32").parameters())
    b = dict(tree_flatten(from_torch_quantized(fused.args, fused.model, "float32").parameters()))
    assert [k for k, _ in a] == list(b)
    for key, value in a:
        assert value.dtype == b[key].dtype and mx.array_equal(value, b[key]).item(), key


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("quant", QUANTS)
def test_logits_match_torch(ggufs, quant, arch):
    lm = load_model(ggufs[quant][arch].gguf_path)
    _assert_logits_match(lm, _prompts(lm.args.vocab_size)[4])  # 45 tokens: crosses gemma3's ring of 15 rows


def _assert_logits_match(lm, ids: list[int], tight: float = 2e-4) -> None:
    """MLX multiplies the exact weights in fp32. Against torch in fp32 on the same dequantized weights: as tight as
    the float backends agree (test_mlx_backend). Against torch's quantized kernels, which round activations to bf16
    (2^-9 relative per element) before each product: the gap is torch's own bf16-vs-fp32 gap (1e-2 of the largest
    logit measured); allowed: that gap plus the tight tolerance, and 2^-5 of the largest logit (8 bf16 ulps)."""
    same_weights = dataclasses.replace(lm, model=build_model(lm.args, lm.model.float_state_dict(), torch.float32,
                                                             "cpu"))
    on_fp32 = _logits(same_weights, ids, "torch")
    on_quantized = _logits(lm, ids, "torch")  # this fuses lm.model's projections: the conversion splits them
    on_mlx = _logits(lm, ids, "mlx")
    torch.testing.assert_close(on_mlx, on_fp32, atol=tight, rtol=1e-4)
    gap, torch_gap = (on_mlx - on_quantized).abs().max().item(), (on_fp32 - on_quantized).abs().max().item()
    assert gap <= torch_gap + tight, (gap, torch_gap)
    assert gap <= 2 ** -5 * on_quantized.abs().max().item(), gap


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("quant", QUANTS)
def test_greedy_batched_equals_alone(ggufs, quant, arch):
    lm = load_model(ggufs[quant][arch].gguf_path)
    prompts, params = _prompts(lm.args.vocab_size), SamplingParams(max_tokens=16)
    batched = run_staggered(make_batcher(lm, 6, _run("mlx")), prompts, ARRIVALS, params)
    alone = [run_staggered(make_batcher(lm, 1, _run("mlx")), [p], [0], params)[0] for p in prompts]
    assert batched == alone


@pytest.mark.parametrize("quant", QUANTS)
def test_held_quantized_and_torch_copy_released(ggufs, quant):
    lm = load_model(ggufs[quant]["llama"].gguf_path)
    summary, weight_bytes = lm.quantization(), lm.weight_bytes()
    torch_tensors = [weakref.ref(t) for t in [*lm.model.parameters(), *lm.model.buffers()]]
    runtime = make_runtime(lm, 2, _run("mlx"))
    model = runtime.batcher.runner.model
    gc.collect()
    assert all(r() is None for r in torch_tensors)  # the torch copy is gone (MLX copied what it needed)
    assert all(t.is_meta for t in [*lm.model.parameters(), *lm.model.buffers()])
    info = runtime.info()
    assert (info["quantization"], info["weights_mb"]) == (summary, round(weight_bytes / 1e6, 1))
    kinds = {type(m).__name__ for _, m in model.named_modules()}
    assert {"QuantizedLinear", "QuantizedEmbedding"} <= kinds and "Linear" not in kinds
    mlx_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    # int4: the same 4 bits + a bf16 scale and bias per 32 as torch's scale and zero; int8: a bf16 scale and bias
    # per group of up to 128 where torch keeps one scale per row (K = 64 here: +2 bytes a row)
    assert 1.0 <= mlx_bytes / weight_bytes < 1.05, (mlx_bytes, weight_bytes)
    assert make_runtime(lm, 1, _run("mlx")).batcher.runner.model is model  # converted once per loaded model
    with pytest.raises(ModelLoadError, match="handed to the MLX backend"):  # its torch copy is gone: said plainly
        make_runtime(lm, 1, _run("torch"))


def test_engine_serves_a_quantized_model_on_mlx(tiny_models_q4):
    c = Client(EngineConfig(max_sessions=2, max_session_tokens=256, step_tokens=32, chunk_tokens=16, backend="mlx"))
    with c.engine:
        model = c.load(tiny_models_q4["gemma3"].gguf_path)
        loaded = c.wait_for(lambda e: isinstance(e, ev.ModelLoaded) and e.model_id == model)
        assert loaded.info["backend"] == "mlx" and "Q4_0→int4" in loaded.info["quantization"]
        assert loaded.info["weights_mb"] > 0
        sid = c.open(model, params=SamplingParams(max_tokens=8))
        assert c.wait(c.send(sid, "hello")).reason in ("stop", "length")


@pytest.mark.slow
def test_embedded_gemma_q4_k_m_on_mlx(gemma_gguf_path):
    """A real file: Q4_K (int4 with zeros: fp32 scales and biases), Q5_0/Q6_K/Q8_0 (int8), all exact; logits as
    above (the tight bound as test_mlx_backend's embedded-Gemma one: 34-wide logits, 18 layers)."""
    lm = load_model(gemma_gguf_path)
    model = from_torch_quantized(lm.args, lm.model, "float32")
    report = model.conversion
    assert report.fp32_scales == report.formats["int4"] > 0 and report.inexact_groups == 0, report
    _assert_exact(lm, model)
    del model
    _assert_logits_match(lm, lm.tokenizer.encode("def fibonacci(n):", add_bos=True), tight=2e-3)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0", "Q5_K", "Q6_K"])
def test_block_codes_convert_exactly(type_name):
    """The x86 kernel's format, should an MLX model ever receive it: the same fp32 weights."""
    import gguf

    from engine.quant.block_codes import slice_codes

    rng = np.random.default_rng(4)
    w = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[type_name]
    try:
        raw = gguf.quants.quantize(w, qtype)
    except NotImplementedError:  # gguf writes few types: dequantize a random block stream instead
        from tests.kernels.test_cpu_qgemm import _random_blocks
        raw = _random_blocks(type_name, 64, 256, rng)
    rows = BlockRows(64, 256, type_name)
    rows.put(0, slice_codes(qtype, type_name, raw, 256))
    held = [rows.done()]
    if type_name in SUPER:  # and as super-blocks, the way Q4_K/Q5_K/Q6_K rows of whole blocks are held
        held.append(superblocks(np.asarray(raw), type_name))
    for qt in held:
        m = convert(qt)
        got = np.array(m.weight) if m.bits is None else np.array(mx.dequantize(
            m.weight, m.scales.astype(mx.float32), m.biases.astype(mx.float32), group_size=m.group_size, bits=m.bits))
        np.testing.assert_array_equal(got, qt.dequantize().numpy())
