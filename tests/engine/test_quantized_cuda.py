"""Quantized GGUF models on CUDA: matrices stay quantized on the GPU (Triton kernels dequantize in registers),
their logits track the CPU's exact dequantization, and greedy batched == alone in both KV layouts."""
from __future__ import annotations

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from engine.models.layers import QuantEmbedding, QuantLinear
from engine.quant.weight import QuantTensor
from tests.engine.test_quantized import assert_batched_equals_alone
from tests.support.tiny_models import ARCHS

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]


@pytest.fixture(scope="module", params=["q8", "q4"])
def cuda_models(request, tiny_models_q8, tiny_models_q4):
    files = tiny_models_q8 if request.param == "q8" else tiny_models_q4
    opts = LoadOptions(device="cuda", dtype="bfloat16", weights="quantized")
    return {arch: load_model(files[arch].gguf_path, opts) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_matrices_stay_quantized_on_the_gpu(cuda_models, arch):
    model = cuda_models[arch].model
    assert isinstance(model.model.embed_tokens, QuantEmbedding)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    tensors = [m for m in model.modules() if isinstance(m, QuantTensor)]
    assert tensors and all(b.is_cuda for t in tensors for b in t.buffers())
    assert any(isinstance(m, QuantLinear) for m in model.modules())


@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_logits_track_the_exact_dequantization(cuda_models, tiny_models_q4, tiny_models_q8, arch):
    from tests.engine.test_quantized import _last_logits

    lm = cuda_models[arch]
    exact = load_model(lm.source, LoadOptions(weights="dequantized"))
    ids = torch.randint(6, lm.args.vocab_size, (24,), generator=torch.Generator().manual_seed(5))
    got, want = _last_logits(lm, ids).float().cpu(), _last_logits(exact, ids)
    assert (got - want).abs().max() < 0.08 * want.abs().max()


@pytest.mark.parametrize("layout", ["sequence", "cell"])
@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_quantized_batched_equals_alone(cuda_models, arch, layout):
    assert_batched_equals_alone(cuda_models[arch], layout)


@pytest.fixture(scope="module")
def mixed_models(tiny_models, tmp_path_factory):
    """Q4_0 with attn_v in Q8_0, as a Q4_K_M file's "more bits" layers: q/k int4 and v int8 rows on CUDA."""
    from tests.support.gguf_export import write_gguf

    root = tmp_path_factory.mktemp("tiny_models_mixed")
    opts = LoadOptions(device="cuda", dtype="bfloat16", weights="quantized")
    return {arch: load_model(write_gguf(m.hf_dir, root / f"{arch}.gguf", "Q4_0", {"attn_v": "Q8_0"}), opts)
            for arch, m in tiny_models.items()}


@pytest.mark.parametrize("layout", ["sequence", "cell"])
@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_format_qkv_fuses_and_batched_equals_alone(mixed_models, arch, layout):
    """int4 q/k beside an int8 v fuse into one stacked matrix (one launch per format, one prologue), and a row's
    result still does not depend on the step."""
    from engine.models.kernel_choice import choose_kernels
    from engine.quant.stacked import StackedRows

    lm = mixed_models[arch]
    assert_batched_equals_alone(lm, layout)
    lm.model.prepare(choose_kernels(torch.device("cuda")))
    stacked = [m for m in lm.model.modules() if isinstance(m, StackedRows)]
    if any(m.format == "int4" for m in lm.model.modules() if isinstance(m, QuantTensor)):
        assert stacked and all(s.format == "int4+int8" for s in stacked)


@pytest.mark.parametrize("weights", ["auto", "quantized", "dequantized"])
def test_a_cuda_load_reads_the_header_once(tiny_models_q4, tmp_path, monkeypatch, weights):
    """`weights="auto"` on CUDA opened the file to size the model, then the load opened it again: the header's token
    strings read twice (~0.2-0.45 s each for a 262,144-token vocabulary)."""
    from engine.loading import loader

    opened, real = [], loader.open_gguf
    monkeypatch.setattr(loader, "open_gguf", lambda path, skip=None: opened.append(path) or real(path, skip))
    opts = LoadOptions(device="cuda", dtype="bfloat16", weights=weights, cache_dir=tmp_path)
    lm = load_model(tiny_models_q4["llama"].gguf_path, opts)
    assert len(opened) == 1 and any(t.is_cuda for t in lm.model.state_dict().values())
