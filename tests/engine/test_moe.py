"""Mixtures of experts (Qwen3-MoE `qwen3_moe` / `qwen3moe`, Mixtral `mixtral` / GGUF `llama`, OLMoE `olmoe`, Qwen2-MoE
`qwen2_moe` / `qwen2moe` with its shared expert, Granite MoE `granitemoe` with Granite's scalars and stacked experts,
ERNIE 4.5 MoE `ernie4_5_moe` / `ernie4_5-moe` with a dense first layer, a selection bias and ungated shared experts,
GLM-4.5 `glm4_moe` / `glm4moe` with sigmoid scores, the bias and a scale):
logits equal to transformers' (HF folder and GGUF, both layouts) and to
llama.cpp's, experts held quantized, greedy batched == alone, MLX equal to PyTorch, the CUDA path, and bad files refused
in one line."""
from __future__ import annotations

import pytest
import torch

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.loading.loader import LoadOptions, load_model
from engine.models.args import ModelArgs, RopeArgs
from engine.models.moe import SparseMoE
from engine.quant.weight import QuantTensor
from tests.engine.test_quantized import assert_batched_equals_alone
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits
from tests.support.tiny_models import make_tiny_hf

pytestmark = pytest.mark.slow  # needs transformers

ARCHS = ["qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "granitemoe", "ernie4_5_moe", "glm4_moe"]
# llama.cpp's f16 cache; the tiny routers' wide margins (tiny_models._randomize) scale its rounding a little further
LLAMA_CPP_TOLERANCE = 2e-3


@pytest.fixture(scope="module", params=ARCHS)
def files(request, tmp_path_factory) -> tuple:
    """(arch, (HF folder, F32 GGUF, Q8_0 GGUF, Q4_0 GGUF))."""
    return request.param, check.tiny_files(tmp_path_factory.mktemp(request.param), request.param)


@pytest.mark.parametrize("source", [0, 1])
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_logits_match_transformers(files, source, layout):
    lm = check.assert_matches_transformers(files[1][0], files[1][source], layout)
    layers = lm.model.model.layers
    assert lm.args.num_experts and all(isinstance(layer.mlp, SparseMoE) == lm.args.sparse_layer(i)
                                       for i, layer in enumerate(layers))


def test_llama_cpp_reads_the_same_model(files):
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(files[1][1])
    assert (got - want).abs().max() < LLAMA_CPP_TOLERANCE * max(5.0, float(want.abs().max())), (got - want).abs().max()


@pytest.mark.parametrize("kind", [2, 3])  # Q8_0, Q4_0
def test_quantized_experts_batched_equals_alone(files, kind):
    """Every expert held quantized; batched rows route and multiply exactly as alone, in both layouts."""
    lm = load_model(files[1][kind], LoadOptions(weights="quantized"))
    experts = _first_moe(lm).experts
    assert all(isinstance(m, QuantTensor) for e in experts for m in (e.gate_proj.qweight, e.down_proj.qweight))
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)


@pytest.fixture(scope="module")
def every_expert(files, tmp_path_factory) -> tuple:
    """The tiny files with every expert used by every token: no routing decision can flip on a rounding (a tiny
    model's router has near ties anywhere), so quantized weights stay near the exact model, expert by expert."""
    return _every_expert_files(tmp_path_factory.mktemp(files[0]), files[0])


def _every_expert_files(root, arch: str) -> tuple:
    return check.tiny_files(root, arch, config={"num_experts_per_tok": 4 if arch == "mixtral" else 8})  # all of them


@pytest.mark.parametrize("kind", [2, 3])
def test_quantized_experts_near_exact(every_expert, kind):
    check.assert_quantized_near_exact_and_invariant(every_expert[kind])


def test_dense_layers_and_unnormalised_weights_match_transformers(tmp_path):
    """Qwen3-MoE's `mlp_only_layers` keep a dense MLP; `norm_topk_prob` false leaves the chosen weights as the softmax
    gave them: both as transformers computes them, and each changes the logits (HF folders only: llama.cpp's qwen3moe
    has neither)."""
    config = {"num_hidden_layers": 3, "mlp_only_layers": [1], "norm_topk_prob": False}
    hf = make_tiny_hf("qwen3_moe", tmp_path / "a", config=config)
    lm = check.assert_matches_transformers(hf, hf, "sequence")
    assert lm.args.dense_layers == [1] and not isinstance(lm.model.model.layers[1].mlp, SparseMoE)
    normalised = load_model(make_tiny_hf("qwen3_moe", tmp_path / "b", config={**config, "norm_topk_prob": True}))
    assert (full_logits(normalised, check.prompt()) - full_logits(lm, check.prompt())).abs().max() > 1e-2


def test_mlx_matches_torch(files):
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(files[1][1], LoadOptions(weights="dequantized")))


def test_mlx_holds_the_experts_quantized(files, every_expert):
    """The quantized experts converted to MLX's affine format (fused gate|up split back per expert): MLX's logits are
    torch's in fp32 on the same dequantized weights, no further from torch's quantized kernels than those are (every
    expert used: no choice to flip); greedy batched == alone, the experts stacked for MLX's gathered products."""
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")
    import dataclasses

    from bench.runs import make_batcher
    from engine.loading.loader import build_model
    from engine.sampling import SamplingParams
    from tests.engine.test_mlx_backend import ARRIVALS, _logits, _prompts, _run
    from tests.support.engine_helpers import run_staggered

    lm = load_model(every_expert[3], LoadOptions(weights="quantized"))
    ids = _prompts(lm.args.vocab_size)[4]
    floats = dataclasses.replace(lm, model=build_model(lm.args, lm.model.float_state_dict(), torch.float32, "cpu"))
    on_fp32, on_quantized, on_mlx = _logits(floats, ids, "torch"), _logits(lm, ids, "torch"), _logits(lm, ids, "mlx")
    torch.testing.assert_close(on_mlx, on_fp32, atol=2e-4, rtol=1e-4)
    assert (on_mlx - on_quantized).abs().max() <= (on_fp32 - on_quantized).abs().max() + 2e-4
    lm = load_model(files[1][3], LoadOptions(weights="quantized"))
    prompts, params = _prompts(lm.args.vocab_size), SamplingParams(max_tokens=12)
    batcher = make_batcher(lm, 6, _run("mlx"))
    batched = run_staggered(batcher, prompts, ARRIVALS, params)
    assert batched == [run_staggered(make_batcher(lm, 1, _run("mlx")), [p], [0], params)[0] for p in prompts]
    # the experts went through MLX's gathered products (routing never read on the host)
    assert all(layer.mlp._stack() is not None for layer in batcher.runner.model.model.layers if "experts" in layer.mlp)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda(files, tmp_path, monkeypatch):
    """The experts stacked and read by index on the device, so decode steps replay as graphs, bf16: near exact and
    batched == alone, floats and quantized (near exact where no routing can flip); the routed quantized model batched
    == alone, also where batched steps group their pairs by expert and a lone row's do not."""
    from bench.runs import RunConfig, make_batcher

    check.assert_on_cuda(files[1][1], "dequantized")
    check.assert_on_cuda(_every_expert_files(tmp_path, files[0])[3], "quantized")
    lm = load_model(files[1][3], LoadOptions(device="cuda", dtype="bfloat16", weights="quantized"))
    monkeypatch.setattr(SparseMoE, "group_rows", 2)  # batched steps grouped, a lone row's not
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)
    assert make_batcher(lm, 2, RunConfig(max_seq_len=128)).runner.graphs is not None
    assert all(layer.mlp.replayable for layer in lm.model.model.layers if isinstance(layer.mlp, SparseMoE))


def _first_moe(lm) -> SparseMoE:
    return next(layer.mlp for layer in lm.model.model.layers if isinstance(layer.mlp, SparseMoE))


def test_routing_is_row_by_row():
    """A row's output does not depend on the rows routed beside it (to the float GEMMs' rounding, which may differ
    between one row and nine), and equals the dense definition: every expert's output times the row's renormalised
    top-k softmax weight, else 0."""
    args = ModelArgs("qwen3_moe", 50, 16, 24, 1, 2, 2, 8, 1e-6, {"global": RopeArgs(1e4)}, ["global"],
                     num_experts=6, experts_per_token=2, moe_intermediate_size=12)
    torch.manual_seed(0)
    moe = SparseMoE(args)
    for p in moe.parameters():
        p.data.normal_()
    x = torch.randn(9, 16)
    with torch.no_grad():
        together = moe(x)
        for i in range(len(x)):
            torch.testing.assert_close(moe(x[i:i + 1])[0], together[i], atol=1e-5, rtol=1e-5)
        probs = torch.softmax(moe.gate(x), -1)
        top = probs.topk(2, -1)
        weight = torch.zeros_like(probs).scatter(1, top.indices, top.values / top.values.sum(-1, keepdim=True))
        dense = sum(weight[:, e, None] * expert(x) for e, expert in enumerate(moe.experts))
    torch.testing.assert_close(together, dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", [1, 3])  # floats, Q4_0's int4
def test_experts_stacked_for_the_device_give_the_module_path(files, kind):
    """CUDA's path (every pair by index from stacked experts; here its PyTorch reference on the CPU): the sorted
    routing, the pairs' rows and the weighted sums give the expert-by-expert result, and the modules keep views."""
    from engine.models.moe import StackedExperts

    lm = load_model(files[1][kind], LoadOptions(weights="dequantized" if kind == 1 else "quantized", device="cpu"))
    moe = _first_moe(lm)
    for expert in moe.experts:
        expert.fuse_projections()
    x = torch.randn(7, lm.args.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = moe._routed(x)  # the routed experts (a shared expert is added after either path)
        if kind == 3:  # the CPU's blocks format has no stacked kernel: nothing is stacked
            assert StackedExperts.stack(moe.experts) is None
            return
        moe._stacked = StackedExperts.stack(moe.experts)
        got = moe._on_device(x, *moe.route(x))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    stacked = moe._stacked.gate_up["weight"]
    assert moe.experts[2].gate_up_proj.weight.data_ptr() == stacked[2].data_ptr()


def test_bad_mixture_metadata_is_refused(tmp_path):
    good = check.tiny_files(tmp_path, "qwen3_moe")[1]
    check.assert_refused(good, tmp_path, "qwen3moe.expert_used_count", 9, "routes each token to 9 experts")
    check.assert_refused(good, tmp_path, "qwen3moe.expert_count", 0, "expert_count")


def test_experts_tensor_of_the_wrong_count_is_refused(tmp_path):
    import gguf

    from tests.support.gguf_export import rewrite_gguf

    good = check.tiny_files(tmp_path, "qwen3_moe")[1]
    bad = rewrite_gguf(gguf.GGUFReader(good), tmp_path / "bad.gguf", extra={"qwen3moe.expert_count": 4,
                                                                           "qwen3moe.expert_used_count": 2})
    with pytest.raises(ModelLoadError, match="does not hold the model's 4 experts"):
        load_model(bad, LoadOptions(weights="dequantized"))


def test_stacked_experts_of_the_wrong_shape_are_refused(tmp_path):
    """A Granite MoE folder whose config names fewer experts than its stacked tensors hold: one line naming the
    tensor, no partial model."""
    import json

    hf = make_tiny_hf("granitemoe", tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(config | {"num_local_experts": 4}))
    with pytest.raises(UnsupportedModelError, match=r"block_sparse_moe\.\w+\.weight has shape \(8, "):
        load_model(hf, LoadOptions(weights="dequantized"))


def test_the_estimate_counts_experts_quantized(tmp_path):
    """A quantized mixture is estimated at its experts' quantized size, not as fp32 (which would refuse a 30B-A3B
    model that fits)."""
    from engine.loading.gguf_file import open_gguf
    from engine.memory import gguf_estimate

    gf = open_gguf(check.tiny_files(tmp_path, "qwen3_moe")[3])
    experts = [t for t in gf.tensors if len(t.shape) == 3]
    assert experts and all(t.tensor_type.name == "Q4_0" for t in experts)
    quantized, floats = gguf_estimate(experts, 0, True, 4), gguf_estimate(experts, 0, False, 4)
    held = sum(t.n_bytes for t in experts)
    assert quantized - gguf_estimate([], 0, True, 4) < 1.5 * held < floats - gguf_estimate([], 0, False, 4)


def test_the_app_imports_mixtures(files):
    from app.core.sqlite_registry import check_model

    assert check_model(files[1][3]) == "gguf" and check_model(files[1][0]) == "hf"


def test_unsupported_refusal_names_the_moe_models():
    from engine.models import architecture

    with pytest.raises(UnsupportedModelError, match="qwen3_moe"):
        architecture("deepseek_v2")


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen2_moe", "ernie4_5_moe", "glm4_moe"])
def k_quant_moe(request, tmp_path_factory):
    """A Q4_K_M file (llama.cpp's own quantizer), loaded quantized: its experts in the library's super-blocks; Qwen2-MoE
    with its shared expert, ERNIE 4.5 with its selection bias and ungated shared experts."""
    pytest.importorskip("llama_cpp")
    from bench.synthetic_gguf import quantize_mix
    from kernels.cpu_native import cpu_kernel
    from tests.support.gguf_export import write_gguf

    if cpu_kernel() is None:
        pytest.skip("the CPU kernel does not build here")
    root = tmp_path_factory.mktemp(request.param)
    sizes = {"hidden_size": 256, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512}
    hf = make_tiny_hf(request.param, root / "hf", config=sizes if request.param == "qwen2_moe" else
                      {k: v for k, v in sizes.items() if not k.startswith("shared")})
    path = root / "q4_k_m.gguf"
    quantize_mix(write_gguf(hf, root / "f32.gguf"), path, "Q4_K_M", threads=2)
    return load_model(path, LoadOptions(weights="quantized"))


def test_k_quant_experts_run_in_one_library_call(k_quant_moe):
    """Each layer's routing, chosen experts and sum in one library call: every row exactly as alone, close to the
    expert-by-expert path (whose router softmax rounds otherwise) and to the PyTorch reference; greedy batched == alone
    in both layouts."""
    from kernels.cpu_moe import moe as library_moe

    lm = k_quant_moe
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)  # prepares the model for the CPU library
    moe = _first_moe(lm)
    blocks = moe._library()
    assert blocks is not None and moe.tapeable and (blocks.shared is not None) == (moe.shared_expert is not None)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        fast = moe(x)
        for i in range(len(x)):
            assert torch.equal(moe(x[i:i + 1])[0], fast[i])
        reference = library_moe(x, moe.gate.weight, blocks, moe.top_k, moe.norm_topk,
                                moe.select.bias if moe.select is not None else None, sigmoid=moe.sigmoid,
                                scaling=moe.scaling, impl="reference")
        held, moe._held = moe._held, ((moe.experts[0].native, id(moe.experts[0].gate_up_proj)), None)
        try:
            modules = moe(x)  # module by module
        finally:
            moe._held = held
    torch.testing.assert_close(fast, modules, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast, reference, atol=2e-3, rtol=2e-3)


def test_k_quant_mixture_decode_steps_are_taped(k_quant_moe):
    """With routing as data, a mixture's CPU decode steps replay from tapes and give the eager steps' tokens."""
    from bench.runs import RunConfig, make_batcher
    from engine.sampling import SamplingParams
    from tests.support.engine_helpers import run_staggered

    lm = k_quant_moe
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(6, lm.args.vocab_size, (n,), generator=g).tolist() for n in (3, 11, 29)]
    params = [SamplingParams(max_tokens=n) for n in (12, 5, 9)]
    run = RunConfig(max_seq_len=128, step_tokens=16, chunk_tokens=8)
    outs = []
    for taped in (False, True):
        batcher = make_batcher(lm, len(prompts), run)
        assert batcher.runner.tapes is not None
        if not taped:
            batcher.runner.tapes = None
        outs.append(run_staggered(batcher, prompts, [0, 0, 2], params))
        tapes = batcher.runner.tapes
    assert outs[1] == outs[0]
    assert tapes.refused is None and len(tapes.tapes) >= 2
