"""A Llama 3.2 1B-shaped file (random weights, Q4_K_M by llama.cpp's own quantizer) loaded on the quantized path:
held in about its file's size, tokenized as llama.cpp does, batched decode == alone. Writing the file takes ~2 min
on 2 cores (once per session), loading it ~20 s."""
import pytest

from bench.runs import RunConfig, make_batcher
from bench.synthetic_gguf import synthetic_gguf
from engine.loading.loader import LoadOptions, load_model
from engine.quant.weight import QuantTensor, blocks_available
from engine.sampling import SamplingParams
from tests.support.engine_helpers import run_staggered

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Once upon a time, in a land far away, there lived a"]


@pytest.fixture(scope="module")
def llama_1b_path(tmp_path_factory):
    return synthetic_gguf("llama-1b", tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="module")
def llama_1b(llama_1b_path):
    return load_model(llama_1b_path, LoadOptions(weights="quantized"))


def test_llama_1b_held_in_about_its_file_size(llama_1b_path, llama_1b):
    assert llama_1b.weight_bytes() <= 1.3 * llama_1b_path.stat().st_size
    assert any(f"Q4_K→{fmt}" in llama_1b.quantization() for fmt in ("blocks", "int4"))
    if blocks_available():  # every matrix is Q4_K/Q6_K of whole super-blocks: held as the file stores them
        held = [m for m in llama_1b.model.modules() if isinstance(m, QuantTensor)]
        assert held and all(m.code_layout.raw == m.source_type for m in held)
    assert llama_1b.notices == []
    assert (llama_1b.args.num_layers, llama_1b.args.hidden_size, llama_1b.args.vocab_size) == (16, 2048, 128256)


def test_llama_1b_tokenizes_like_llama_cpp(llama_1b_path, llama_1b):
    import llama_cpp

    ref = llama_cpp.Llama(model_path=str(llama_1b_path), vocab_only=True, verbose=False)
    for text in PROMPTS:
        assert llama_1b.tokenizer.encode(text, add_bos=True) == ref.tokenize(text.encode())


def test_llama_1b_batched_greedy_equals_alone(llama_1b):
    prompts = [llama_1b.tokenizer.encode(text, add_bos=True) for text in PROMPTS]
    params = SamplingParams(max_tokens=4)
    run = RunConfig(max_seq_len=64)
    together = run_staggered(make_batcher(llama_1b, 2, run), prompts, [0, 0], params)
    for prompt, got in zip(prompts, together):
        assert len(got) == 4
        assert got == run_staggered(make_batcher(llama_1b, 1, run), [prompt], [0], params)[0]
