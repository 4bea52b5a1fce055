"""Weights kept quantized: GGUF blocks read exactly, the CPU formats against their dequantized selves, whole tiny
models on the quantized path (batched == alone, both layouts), the embedded model's size and its notices."""
import gguf
import numpy as np
import pytest
import torch

from bench.runs import RunConfig, make_batcher
from engine.loading.loader import LoadOptions, load_model
from engine.models.layers import QuantEmbedding, QuantLinear
from engine.quant.gguf_blocks import int4_groups
from engine.quant import weight
from engine.quant.weight import Int8Rows, _int4_block, bf16_tensor, pack_int4
from engine.sampling import SamplingParams
from tests.support.engine_helpers import run_staggered
from tests.support.tiny_models import ARCHS


def _blocks(qtype: str, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    t = getattr(gguf.GGMLQuantizationType, qtype)
    raw = gguf.quants.quantize(w, t)
    return raw, gguf.quants.dequantize(raw, t).reshape(n, k)


def _from_groups(g) -> np.ndarray:
    n, k = g.codes.shape
    return ((g.codes.reshape(n, -1, 32).astype(np.float32) - 8) * g.scale[..., None] + g.zero[..., None]).reshape(n, k)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_four_bit_blocks_read_exactly(qtype):
    raw, ref = _blocks(qtype, 48, 256)
    np.testing.assert_array_equal(_from_groups(int4_groups(qtype, raw, 48, 256)), ref)


def test_int4_packing_layout_is_known_here():
    assert _int4_block() in (16, 32, 64)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_int4_tensor_products_and_rows(qtype):
    raw, _ = _blocks(qtype, 128, 128, seed=1)
    g = int4_groups(qtype, raw, 128, 128)
    qt = pack_int4(g, qtype)
    # the kernel's own numbers: codes exact, scale and zero rounded to bf16
    s = torch.from_numpy(g.scale).bfloat16().float()
    z = torch.from_numpy(g.zero).bfloat16().float()
    w = ((torch.from_numpy(g.codes).float().reshape(128, -1, 32) - 8) * s[..., None] + z[..., None]).reshape(128, 128)
    torch.testing.assert_close(qt.dequantize(), w)
    ids = torch.tensor([0, 127, 17, 17, 64, 33, 100])
    torch.testing.assert_close(qt.rows(ids), w[ids])
    x = torch.randn(5, 128)
    torch.testing.assert_close(qt(x), x.bfloat16().float() @ w.t(), atol=2e-2, rtol=2e-2)
    assert qt(x).dtype == torch.float32 and qt.nbytes() == 128 * 128 // 2 + 4 * 128 * 128 // 32


def test_int8_rows_requantize_within_a_step():
    raw, ref = _blocks("Q8_0", 32, 256, seed=2)
    out = Int8Rows(32, 256)
    out.put(0, ref[:20])
    out.put(20, ref[20:])
    qt = out.done("Q8_0")
    step = np.abs(ref).max(1, keepdims=True) / 127
    assert (np.abs(qt.dequantize().numpy() - ref) <= 0.5 * step * 1.01 + 1e-7).all()
    torch.testing.assert_close(qt.rows(torch.tensor([3, 31])), qt.dequantize()[[3, 31]])
    x = torch.randn(3, 256)
    torch.testing.assert_close(qt(x), x @ qt.dequantize().t(), atol=3e-2, rtol=3e-2)


def test_bf16_tensor_rows_and_product():
    w = torch.randn(16, 64)
    qt = bf16_tensor(w, "F16")
    torch.testing.assert_close(qt.rows(torch.tensor([2])), w[[2]].bfloat16().float())
    x = torch.randn(2, 64)
    torch.testing.assert_close(qt(x), x @ w.t(), atol=5e-2, rtol=2e-2)


@pytest.fixture(scope="module", params=["q8-blocks", "q4-blocks", "q8-torch", "q4-torch"])
def quantized_models(request, tiny_models_q8, tiny_models_q4):
    """Each file type on each CPU kernel: Parley's own (blocks) where it builds, and torch's int4/int8 formats."""
    scheme, kernel = request.param.split("-")
    files = tiny_models_q8 if scheme == "q8" else tiny_models_q4
    if kernel == "blocks" and not weight.blocks_available():
        pytest.skip("the CPU kernel does not build here")
    with pytest.MonkeyPatch.context() as mp:
        if kernel == "torch":
            mp.setattr(weight, "blocks_available", lambda: False)
        models = {arch: load_model(files[arch].gguf_path, LoadOptions(weights="quantized")) for arch in ARCHS}
    held = {m.qweight.format for lm in models.values() for m in lm.model.modules() if isinstance(m, QuantLinear)}
    assert held <= ({"blocks"} if kernel == "blocks" else {"int4", "int8", "bf16"}), held
    return models


@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_model_holds_no_float_matrix(quantized_models, arch):
    model = quantized_models[arch].model
    assert isinstance(model.model.embed_tokens, QuantEmbedding)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert not linears, [type(m) for m in linears]
    assert any(isinstance(m, QuantLinear) for m in model.modules())
    assert "→" in quantized_models[arch].quantization()


@pytest.mark.parametrize("layout", ["sequence", "cell"])
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_batched_equals_alone(quantized_models, arch, layout):
    assert_batched_equals_alone(quantized_models[arch], layout)


def assert_batched_equals_alone(lm, layout: str) -> None:
    """Four staggered prompts batched give each exactly the greedy tokens it gets alone."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(6, lm.args.vocab_size, (n,), generator=g).tolist() for n in (3, 11, 29, 40)]
    params = SamplingParams(max_tokens=12)
    run = RunConfig(kv_layout=layout, max_seq_len=128, step_tokens=16, chunk_tokens=8)
    together = run_staggered(make_batcher(lm, 4, run), prompts, [0, 0, 2, 5], params)
    for prompt, got in zip(prompts, together):
        alone = run_staggered(make_batcher(lm, 1, run), [prompt], [0], params)[0]
        assert got == alone


def test_cpu_cache_is_fp16_for_quantized_weights_fp32_for_dequantized(tiny_models_q4):
    """Quantized weights on the CPU keep their KV cache in fp16 where the library reads it (half the bytes a token, as
    llama.cpp); the dequantized path keeps fp32, the numbers transformers computes."""
    from kernels.cpu_native import cpu_kernel

    path = tiny_models_q4[ARCHS[0]].gguf_path
    run = RunConfig(max_seq_len=64)
    quantized = make_batcher(load_model(path, LoadOptions(weights="quantized")), 1, run).cache
    dequantized = make_batcher(load_model(path, LoadOptions(weights="dequantized")), 1, run).cache
    assert quantized.config.dtype == ("float16" if cpu_kernel() is not None else "float32")
    assert quantized.k[0].dtype == quantized.config.torch_dtype
    assert dequantized.config.dtype == "float32"


@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_logits_near_dequantized(tiny_models_q8, arch):
    """Q8_0 requantized to int8 rows with bf16 activations stays close to the exact fp32 dequantization."""
    path = tiny_models_q8[arch].gguf_path
    q = load_model(path, LoadOptions(weights="quantized"))
    f = load_model(path, LoadOptions(weights="dequantized"))
    ids = torch.randint(6, q.args.vocab_size, (24,), generator=torch.Generator().manual_seed(5))
    lq, lf = _last_logits(q, ids), _last_logits(f, ids)
    assert (lq - lf).abs().max() < 0.05 * lf.abs().max()


def _last_logits(lm, ids: torch.Tensor) -> torch.Tensor:
    from engine.step import StepBatch

    b = make_batcher(lm, 1, RunConfig(max_seq_len=64))
    slot = b.cache.seq_new()
    segs = b.cache.declare_step([(slot, len(ids))])
    batch = StepBatch(ids, torch.arange(len(ids)), segs, torch.tensor([len(ids) - 1]), [], [])
    logits = b.runner.run(batch)[0]
    b.cache.commit_step()
    return logits[0]


@pytest.fixture(scope="module")
def q5_k_m_path(tmp_path_factory):
    """A small Llama-shaped file (hidden 256, 4 layers) quantized to Q5_K_M by llama.cpp (~2 s): Q5_K matrices, Q6_K
    for the tied embedding and the last layers' v and down, every one of whole super-blocks."""
    pytest.importorskip("llama_cpp")
    if not weight.blocks_available():
        pytest.skip("the CPU kernel does not build here")
    from bench.synthetic_gguf import synthetic_gguf

    return synthetic_gguf("llama-draft", tmp_path_factory.mktemp("q5_k_m"), kind="Q5_K_M")


def test_q5_k_m_held_as_the_files_super_blocks(q5_k_m_path):
    """Q5_K held in its file's 176 bytes per 256 weights (kernels/cpu/kgemm.c), fused q/k/v and gate/up beside
    Q6_K v and down; batched decode == alone, logits near the dequantized model's."""
    from engine.quant.block_codes import BLOCK
    from engine.quant.weight import QuantTensor

    lm = load_model(q5_k_m_path, LoadOptions(weights="quantized"))
    held = [m for m in lm.model.modules() if isinstance(m, QuantTensor)]
    assert {m.source_type for m in held} == {"Q5_K", "Q6_K"}
    for m in held:
        assert m.code_layout.raw == m.source_type
        assert m.nbytes() == m.shape[0] * m.shape[1] // 256 * BLOCK[m.source_type][0]
    assert_batched_equals_alone(lm, "sequence")
    f = load_model(q5_k_m_path, LoadOptions(weights="dequantized"))
    ids = torch.randint(6, lm.args.vocab_size, (24,), generator=torch.Generator().manual_seed(5))
    lq, lf = _last_logits(lm, ids), _last_logits(f, ids)
    assert (lq - lf).abs().max() < 0.05 * lf.abs().max()


@pytest.mark.slow
def test_embedded_model_stays_quantized(gemma_gguf_path, gemma_lm_quantized):
    """Q4_K read exactly from the real file; the whole model held in about its file's size."""
    from engine.loading.gguf_file import open_gguf

    # our header reader finds the bytes (gguf's GGUFReader takes ~12 s on its 262k-token list); gguf decodes them
    t = next(t for t in open_gguf(gemma_gguf_path).tensors if t.tensor_type.name == "Q4_K")
    k, n = int(t.shape[0]), int(t.shape[1])
    ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(n, k)
    np.testing.assert_array_equal(_from_groups(int4_groups("Q4_K", t.data, n, k)), ref)
    size = gemma_gguf_path.stat().st_size
    assert gemma_lm_quantized.weight_bytes() < 1.1 * size
    assert gemma_lm_quantized.notices == []


def test_model_larger_than_free_memory_is_refused(tiny_models_q8, monkeypatch):
    from engine.errors import ModelLoadError

    monkeypatch.setattr("engine.memory.available_bytes", lambda device: 300 << 20)
    with pytest.raises(ModelLoadError, match=r"^\S+ needs ~\d+\.\d+ GB, 0\.29? GB of memory free\.$"):
        load_model(tiny_models_q8["llama"].gguf_path, LoadOptions(weights="quantized"))


@pytest.mark.parametrize("weights", ["quantized", "dequantized"])
def test_estimate_matches_what_loads(tiny_models_q4, weights):
    from engine.loading.gguf_file import open_gguf
    from engine.memory import LOAD_SCRATCH, gguf_estimate

    path = tiny_models_q4["llama"].gguf_path
    lm = load_model(path, LoadOptions(weights=weights))
    gf = open_gguf(path)
    rope = sum(4 * t.shape[0] for t in gf.tensors if t.name == "rope_freqs.weight")  # becomes args, not a weight
    estimate = gguf_estimate(gf.tensors, 0, weights == "quantized", 4) - LOAD_SCRATCH - rope
    assert abs(estimate - lm.weight_bytes()) <= 0.05 * lm.weight_bytes()


def test_tensor_claiming_more_blocks_than_it_holds_is_refused(tmp_path):
    """A shape whose blocks run past the tensor's own bytes into the next one: one clear line, nothing loaded."""
    from engine.errors import ModelLoadError

    q4 = gguf.GGMLQuantizationType.Q4_0
    blocks = gguf.quants.quantize(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), q4)
    w = gguf.GGUFWriter(tmp_path / "bad.gguf", "llama")
    w.add_tensor("blk.0.attn_q.weight", blocks, raw_shape=(64, 54), raw_dtype=q4)  # 96 columns' bytes, 64 written
    w.add_tensor("blk.0.attn_k.weight", blocks, raw_dtype=q4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"blk\.0\.attn_q\.weight .* overlaps tensor blk\.0\.attn_k\.weight"):
        load_model(tmp_path / "bad.gguf")


@pytest.mark.parametrize("scheme", ["q8", "q4"])
def test_hf_folder_quantized_at_load(tiny_models, scheme):
    """--quantize: a float checkpoint's matrices held quantized, close to the float model, batch invariant."""
    hf = tiny_models["llama"].hf_dir
    q = load_model(hf, LoadOptions(quantize=scheme))
    f = load_model(hf, LoadOptions())
    assert isinstance(q.model.model.embed_tokens, QuantEmbedding) and q.weight_bytes() < 0.5 * f.weight_bytes()
    ids = torch.randint(6, q.args.vocab_size, (24,), generator=torch.Generator().manual_seed(5))
    lq, lf = _last_logits(q, ids), _last_logits(f, ids)
    assert (lq - lf).abs().max() < (0.05 if scheme == "q8" else 0.25) * lf.abs().max()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(6, q.args.vocab_size, (n,), generator=g).tolist() for n in (5, 17, 30)]
    run = RunConfig(max_seq_len=96, step_tokens=16, chunk_tokens=8)
    together = run_staggered(make_batcher(q, 3, run), prompts, [0, 1, 3], SamplingParams(max_tokens=8))
    assert together == [run_staggered(make_batcher(q, 1, run), [p], [0], SamplingParams(max_tokens=8))[0] for p in prompts]


def test_weights_quantized_on_a_folder_is_said_not_dropped(tiny_models):
    """The app's weights "quantized" reaches every model: a folder's matrices load as floats, and the load says so
    (no word before: the notices were empty); --quantize does quantize it, and "auto" asks nothing."""
    hf = tiny_models["llama"].hf_dir
    floats = load_model(hf, LoadOptions(weights="quantized"))
    assert not floats.is_quantized()
    assert floats.notices == [f"Weights \"quantized\" keeps a GGUF file's matrices quantized; {hf.name} is a Hugging "
                              "Face folder, whose matrices load as floats."]
    assert load_model(hf, LoadOptions(weights="quantized", quantize="q8")).notices == []
    assert load_model(hf, LoadOptions()).notices == []


def test_auto_weights_quantized_on_cpu_floats_on_a_roomy_gpu(tiny_models_q4, monkeypatch):
    """weights="auto": quantized on the CPU; on CUDA floats only for a small model that takes a modest share of the
    free memory (a model of QUANTIZED_FROM_WEIGHTS matrix weights or more decodes faster quantized)."""
    from engine.loading import loader

    path = tiny_models_q4["llama"].gguf_path
    opts = LoadOptions()
    assert opts.weights == "auto" and loader._resolve_weights(path, opts).weights == "quantized"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # resolving only reads the file's header
    opts.device, opts.dtype = "cuda", "bfloat16"
    monkeypatch.setattr(loader, "available_bytes", lambda device: 1 << 40)
    assert loader._resolve_weights(path, opts).weights == "dequantized"
    with loader._OpenOnce(path) as opened:  # as load_model passes it: the file its read goes on to use
        assert loader._resolve_weights(path, opts, opened).weights == "dequantized"
        assert opened.file is not None and opened() is opened.file
    monkeypatch.setattr(loader, "available_bytes", lambda device: 1 << 10)
    assert loader._resolve_weights(path, opts).weights == "quantized"
    monkeypatch.setattr(loader, "available_bytes", lambda device: 1 << 40)
    weights = loader._matrix_weights(loader.open_gguf(path).tensors)
    monkeypatch.setattr(loader, "QUANTIZED_FROM_WEIGHTS", weights)
    assert loader._resolve_weights(path, opts).weights == "quantized"
    monkeypatch.setattr(loader, "QUANTIZED_FROM_WEIGHTS", weights + 1)
    assert loader._resolve_weights(path, opts).weights == "dequantized"


@pytest.mark.parametrize("quantize", [None, "q8"])
def test_hf_folder_estimate_and_refusal(tiny_models, monkeypatch, quantize):
    """A folder is sized from its safetensors headers before any shard is read: the estimate covers what loads, and
    a folder larger than the free memory is refused in one line."""
    from engine.errors import ModelLoadError
    from engine.loading import hf_folder
    from engine.memory import hf_estimate

    folder = tiny_models["llama"].hf_dir
    lm = load_model(folder, LoadOptions(quantize=quantize))
    staging, final = hf_estimate(hf_folder.tensor_shapes(folder), 0, 4, quantize, "cpu")
    assert abs(final - lm.weight_bytes()) <= 0.05 * lm.weight_bytes() and staging > final
    monkeypatch.setattr("engine.memory.available_bytes", lambda device: 1 << 20)
    with pytest.raises(ModelLoadError, match=r"^\S+ needs ~\d+\.\d GB, 0\.0 GB of memory free\.$"):
        load_model(folder, LoadOptions(quantize=quantize))


def test_damaged_safetensors_header_is_refused(tiny_models, tmp_path):
    import shutil

    from engine.errors import ModelLoadError

    folder = tmp_path / "model"
    shutil.copytree(tiny_models["llama"].hf_dir, folder)
    shard = next(folder.glob("*.safetensors"))
    shard.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ModelLoadError, match="not a safetensors file"):
        load_model(folder, LoadOptions())
