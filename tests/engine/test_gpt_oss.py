"""gpt-oss (`gpt_oss` folders, `gpt-oss` files) on a tiny random model: logits equal to transformers' from the folder
and its F32 GGUF (both KV layouts), to llama.cpp's from the file; the sinks, the clamp and the biases each change the
answer; quantized experts near the exact model with greedy batched == alone; MXFP4 blocks read as transformers reads
them; MLX equal to PyTorch; the CUDA path."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from engine.models.gpt_oss import args_from_hf, sanitize
from engine.quant.mxfp4 import Mxfp4Rows, dequantize_mxfp4
from tests.support import arch_checks as check
from tests.support.engine_helpers import full_logits

pytestmark = pytest.mark.slow  # needs transformers

# llama.cpp truncates YaRN's ramp (transformers' gpt-oss config says not to): the files cross-checked against
# transformers come from a truncated folder; the default folder keeps gpt-oss's untruncated one
TRUNCATED = {"rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": True, "original_max_position_embeddings": 64}}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("gpt_oss"), "gpt_oss", config=TRUNCATED)


@pytest.fixture(scope="module")
def untruncated(tmp_path_factory) -> tuple:
    return check.tiny_files(tmp_path_factory.mktemp("gpt_oss_untruncated"), "gpt_oss")


@pytest.mark.parametrize("source, layout", [(0, "sequence"), (0, "cell"), (1, "sequence"), (1, "cell")])
def test_logits_match_transformers(files, source, layout):
    lm = check.assert_matches_transformers(files[0], files[source], layout)
    args = lm.args
    assert args.layer_types == ["sliding", "global", "sliding"] and args.sliding_window == 8
    assert args.attn_sinks and args.router_bias and args.expert_bias and args.glu_limit == 7.0


def test_the_folder_keeps_yarn_untruncated(untruncated):
    """gpt-oss's own config: the ramp between the kept and the scaled frequencies is not rounded to whole pairs."""
    lm = check.assert_matches_transformers(untruncated[0], untruncated[0], "sequence")
    file_rope = load_model(untruncated[1]).args.rope["global"].factors
    assert lm.args.rope["global"].factors != file_rope  # the file's is llama.cpp's, truncated


def test_llama_cpp_reads_the_same_model(files):
    """llama.cpp's own graph on the same file, its cache fp32 as Parley's (its f16 cache leaves them ~3e-3 apart: the
    tiny experts' wide weights amplify the cache's rounding)."""
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(files[1], f32_cache=True)
    assert (got - want).abs().max() < 1e-4 * max(5.0, float(want.abs().max())), (got - want).abs().max()


def test_sinks_clamp_and_biases_each_matter(files):
    """Zeroing the sinks, lifting the clamp or dropping the experts' biases each moves the logits: every part runs."""
    want = full_logits(load_model(files[1]), check.prompt())
    for change in ("sinks", "clamp", "bias"):
        lm = load_model(files[1])
        for layer in lm.model.model.layers:
            if change == "sinks":
                layer.self_attn.sinks.data.zero_()
            for expert in layer.mlp.experts:
                if change == "clamp":
                    expert.glu.limit = 1e9
                if change == "bias":
                    expert.down_proj.bias.data.zero_()
        assert (full_logits(lm, check.prompt()) - want).abs().max() > 1e-2, change


def test_the_clamp_bites_on_the_tiny_model(files):
    """The tiny experts' gate values pass ±7 (so the clamp test above tests the clamp, not nothing)."""
    lm = load_model(files[1])
    x = torch.randn(64, lm.args.hidden_size, generator=torch.Generator().manual_seed(0))
    expert = lm.model.model.layers[0].mlp.experts[0]
    assert expert.gate_proj(x).abs().max() > 7.0


@pytest.mark.parametrize("kind", [2, 3])  # Q8_0, Q4_0
def test_quantized_drifts_no_more_than_llama_cpp_and_is_invariant(files, kind):
    """The tiny experts' wide gates (past the clamp) amplify every quantized runtime's rounding: held quantized,
    Parley's logits stay as near the file's exact values as llama.cpp's own run of the file (here 8 % and 22 % of the
    largest logit against llama.cpp's 19 % and 21 %; a lost bias or expert is ~100 %); greedy batched == alone."""
    from tests.support.arch_checks import QuantTensor, assert_batched_equals_alone

    lm = _assert_drift_within_llama_cpp(files[kind])
    assert all(isinstance(e.down_proj.qweight, QuantTensor) for e in lm.model.model.layers[0].mlp.experts)
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)


def test_mxfp4_blocks_read_as_transformers_reads_them():
    """A folder's MXFP4 experts (blocks and scales): the same floats as transformers' own conversion, then split per
    expert with gate and up de-interleaved."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (2, 6, 2, 16), generator=gen, dtype=torch.uint8)  # 2 experts, 6 rows, 64 columns
    scales = torch.randint(120, 132, (2, 6, 2), generator=gen, dtype=torch.uint8)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # (experts, in, out)
    torch.testing.assert_close(dequantize_mxfp4(blocks, scales).transpose(1, 2), want, atol=0, rtol=0)
    args = dataclasses.replace(args_from_hf(_config()), num_experts=2)
    out = sanitize({"model.layers.0.mlp.experts.gate_up_proj_blocks": blocks,
                    "model.layers.0.mlp.experts.gate_up_proj_scales": scales}, args)
    up = out["model.layers.0.mlp.experts.1.up_proj.weight"]
    assert isinstance(up, Mxfp4Rows)  # still blocks: the loader holds them 4-bit or decodes them
    torch.testing.assert_close(up.dequantize(), want[1].t()[1::2], atol=0, rtol=0)
    with pytest.raises(Exception, match="no .*scales"):
        sanitize({"model.layers.0.mlp.experts.down_proj_blocks": blocks}, args)
    with pytest.raises(Exception, match="down_proj_blocks: MXFP4 blocks .* do not match"):  # a damaged folder
        sanitize({"model.layers.0.mlp.experts.down_proj_blocks": blocks,
                  "model.layers.0.mlp.experts.down_proj_scales": scales[:, :5]}, args)


def test_a_folders_mxfp4_matrix_is_held_as_a_files_would_be(monkeypatch):
    """A folder's MXFP4 rows in each runtime's format hold exactly the values transformers decodes: the CPU's own
    blocks, CUDA's fp4 words (built on the CPU); int8 rows near them on torch's CPU kernels, and on CUDA for scales
    beyond its bf16 ones."""
    gen = torch.Generator().manual_seed(4)
    rows = Mxfp4Rows(torch.randint(0, 256, (16, 3, 16), generator=gen, dtype=torch.uint8),
                     torch.randint(118, 129, (16, 3), generator=gen, dtype=torch.uint8))
    want = rows.dequantize()
    assert torch.equal(rows.held("cuda").dequantize(), want) and rows.held("cuda").format == "fp4"
    assert torch.equal(rows.held("cpu").dequantize(), want)
    high = Mxfp4Rows(rows.blocks, rows.scales.clone().index_fill_(0, torch.tensor([3]), 130))
    assert high.held("cuda").format == "int8"
    monkeypatch.setattr("engine.quant.weight.blocks_available", lambda: False)  # torch's CPU kernels
    for held, values in ((rows.held("cpu"), want), (high.held("cuda"), high.dequantize())):
        assert held.format == "int8" and (held.dequantize() - values).abs().max() <= values.abs().max() / 127


def test_a_folders_mxfp4_experts_stay_4_bit(files, tmp_path):
    """A folder whose experts are MXFP4 blocks (as openai/gpt-oss-20b ships): held 4-bit at load unless dequantized
    weights are asked for, and then the model a GGUF file of the same blocks gives (logits within fp32 sums' order;
    that file's drift is checked against llama.cpp's above); the memory estimate counts them 4-bit; greedy batched ==
    alone."""
    from engine.loading.hf_folder import tensor_shapes
    from engine.memory import hf_estimate
    from kernels.cpu_native import cpu_kernel
    from tests.support.arch_checks import assert_batched_equals_alone
    from tests.support.gguf_export import write_gguf

    path = write_gguf(files[0], tmp_path / "mxfp4.gguf", "F32", overrides={"_exps.weight": "MXFP4"})
    folder = _folder_from_gguf_experts(path, files[0], tmp_path / "mxfp4")
    lm, from_file, exact = load_model(folder), load_model(path), load_model(folder, LoadOptions(weights="dequantized"))
    down = lm.model.model.layers[0].mlp.experts[0].down_proj.qweight
    assert down.source_type == "MXFP4" and (down.format == "blocks") == (cpu_kernel() is not None)
    assert not exact.is_quantized()
    ids = check.prompt()
    got, want = full_logits(lm, ids, "sequence"), full_logits(from_file, ids, "sequence")
    # the same experts' bits (fp32 sums elsewhere ordered apart: ~5e-6); a nibble or row out of place moves them ~0.3
    assert (got - want).abs().max() < 1e-4 * want.abs().max()
    shapes = tensor_shapes(folder)
    assert hf_estimate(shapes, 300, 4, None, "cpu", mxfp4=True)[1] < hf_estimate(shapes, 300, 4, None, "cpu")[1]
    assert not lm.notices
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)


def test_a_folders_mxfp4_on_torchs_kernels_says_it_is_requantized(files, tmp_path, monkeypatch):
    """Without the CPU's own kernels a folder's MXFP4 experts become int8 rows, with the notice a file's get."""
    from tests.support.gguf_export import write_gguf

    path = write_gguf(files[0], tmp_path / "mxfp4.gguf", "F32", overrides={"_exps.weight": "MXFP4"})
    folder = _folder_from_gguf_experts(path, files[0], tmp_path / "mxfp4")
    monkeypatch.setattr("engine.quant.weight.blocks_available", lambda: False)
    lm = load_model(folder)
    assert lm.model.model.layers[0].mlp.experts[0].down_proj.qweight.format == "int8"
    experts = 3 * lm.args.num_experts * lm.args.num_layers
    assert lm.notices == [f"mxfp4: {experts} tensor(s) of type MXFP4 have no kernel of their own: re-quantized to int8."]


def _folder_from_gguf_experts(path, src, dst):
    """`src` (the folder `path` was written from) with its experts' matrices replaced by `path`'s MXFP4 blocks in
    transformers' layout: gate and up rows interleaved, (experts, out, in/32, 16) bytes (element 2j low, 2j + 1
    high) and (experts, out, in/32) exponents."""
    import shutil

    import gguf
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    raw = {t.name: torch.from_numpy(np.array(t.data)) for t in gguf.GGUFReader(path).tensors if "_exps." in t.name}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        layer = name.split(".")[2]
        if name.endswith("gate_up_proj"):
            gate, up = raw[f"blk.{layer}.ffn_gate_exps.weight"], raw[f"blk.{layer}.ffn_up_exps.weight"]
            blocks = torch.stack([gate, up], dim=2).flatten(1, 2)  # rows gate, up, gate, up, ...
        else:
            blocks = raw[f"blk.{layer}.ffn_down_exps.weight"]
        b = blocks.reshape(*blocks.shape[:2], -1, 17)
        elements = torch.cat([b[..., 1:] & 0x0F, b[..., 1:] >> 4], dim=-1)  # GGUF: element j low, j + 16 high
        del tensors[name]
        tensors[f"{name}_blocks"] = elements[..., 0::2] | (elements[..., 1::2] << 4)
        tensors[f"{name}_scales"] = b[..., 0].contiguous()
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_mxfp4_blocks_are_estimated_as_the_floats_they_become(tmp_path):
    """The memory estimate counts an MXFP4 tensor as its decoded elements (half a byte each as stored), so a folder
    too large once decoded is refused before it is read."""
    from safetensors.torch import save_file

    from engine.loading.hf_folder import tensor_shapes

    save_file({"model.layers.0.mlp.experts.down_proj_blocks": torch.zeros(2, 6, 2, 16, dtype=torch.uint8),
               "model.layers.0.mlp.experts.down_proj_scales": torch.zeros(2, 6, 2, dtype=torch.uint8)},
              str(tmp_path / "model.safetensors"))
    assert sorted(tensor_shapes(tmp_path)) == [((2, 6, 2), 1), ((2, 6, 64), 0.5)]


def test_mxfp4_file_experts_stay_mxfp4(files, tmp_path):
    """A file whose experts are MXFP4 (as llama.cpp writes gpt-oss): on the CPU's own kernels held as they are (4-bit
    indices into the 16 values, the block's power-of-two scale; no notice), elsewhere as int8 groups with a notice; as
    near the file's exact values as llama.cpp's native MXFP4 run of it; greedy batched == alone."""
    from engine.quant.block_codes import FP4_CODES
    from kernels.cpu_native import cpu_kernel
    from tests.support.arch_checks import assert_batched_equals_alone
    from tests.support.gguf_export import write_gguf

    path = write_gguf(files[0], tmp_path / "mxfp4.gguf", "F32", overrides={"_exps.weight": "MXFP4"})
    lm = _assert_drift_within_llama_cpp(path)
    down = lm.model.model.layers[0].mlp.experts[0].down_proj.qweight
    if cpu_kernel() is not None:
        assert down.format == "blocks" and down.code_layout.lut and not lm.notices
        assert down.codes.numel() == down.shape[0] * down.shape[1] // 2  # 4 bits a weight
        assert sorted(set(down.natural_codes()[0].unique().tolist())) <= sorted(set(FP4_CODES.tolist()))
    else:
        assert any("MXFP4" in n for n in lm.notices)
    for layout in ("sequence", "cell"):
        assert_batched_equals_alone(lm, layout)


@pytest.mark.parametrize("kind", ["mxfp4", 2, 3])  # MXFP4 experts, Q8_0, Q4_0
def test_quantized_layers_are_one_library_call_and_taped(files, tmp_path, kind):
    """Each layer's routing (the router's bias included), chosen experts (their biases, the clamped activation) and
    sum in one library call: near the expert-by-expert path, every row as alone; decode steps replay from CPU tapes
    and give the eager steps' tokens."""
    from bench.runs import RunConfig, make_batcher
    from engine.sampling import SamplingParams
    from kernels.cpu_moe import CodeExperts
    from kernels.cpu_native import cpu_kernel
    from tests.support.engine_helpers import run_staggered
    from tests.support.gguf_export import write_gguf

    if cpu_kernel() is None:
        pytest.skip("the CPU kernel does not build here")
    # MXFP4 experts beside Q8_0 matrices, as llama.cpp's gpt-oss files (an F32 attention would run in torch: no tape)
    path = write_gguf(files[0], tmp_path / "mxfp4.gguf", "Q8_0", overrides={"_exps.weight": "MXFP4"}) \
        if kind == "mxfp4" else files[kind]
    lm = load_model(path, LoadOptions(weights="quantized"))
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(6, lm.args.vocab_size, (n,), generator=g).tolist() for n in (3, 11, 29)]
    params = [SamplingParams(max_tokens=n) for n in (12, 5, 9)]
    outs = []
    for taped in (False, True):
        batcher = make_batcher(lm, len(prompts), RunConfig(max_seq_len=128, step_tokens=16, chunk_tokens=8))
        if not taped:
            batcher.runner.tapes = None
        outs.append(run_staggered(batcher, prompts, [0, 0, 2], params))
        tapes = batcher.runner.tapes
    assert outs[1] == outs[0] and tapes.refused is None and len(tapes.tapes) >= 2
    moe = lm.model.model.layers[0].mlp
    assert isinstance(moe._library(), CodeExperts) and moe.tapeable
    x = torch.randn(9, lm.args.hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        fast = moe(x)
        assert all(torch.equal(moe(x[i:i + 1])[0], fast[i]) for i in range(len(x)))
        held, moe._held = moe._held, ((moe.experts[0].native, id(moe.experts[0].gate_up_proj)), None)
        try:
            modules = moe(x)  # expert by expert
        finally:
            moe._held = held
    torch.testing.assert_close(fast, modules, atol=1e-4 * float(modules.abs().max()), rtol=1e-4)


def test_mlx_holds_mxfp4_experts_exactly(files, tmp_path):
    """The MXFP4 experts on MLX (in MLX's own "mxfp4" mode: 4-bit floats and an exponent byte per 32): MLX's logits
    are torch's in fp32 on the same dequantized weights."""
    pytest.importorskip("mlx.core")
    from engine.loading.loader import build_model
    from tests.engine.test_mlx_backend import _logits, _prompts
    from tests.support.gguf_export import write_gguf

    path = write_gguf(files[0], tmp_path / "mxfp4.gguf", "F32", overrides={"_exps.weight": "MXFP4"})
    lm = load_model(path, LoadOptions(weights="quantized"))
    ids = _prompts(lm.args.vocab_size)[4]
    floats = dataclasses.replace(lm, model=build_model(lm.args, lm.model.float_state_dict(), torch.float32, "cpu"))
    torch.testing.assert_close(_logits(lm, ids, "mlx"), _logits(floats, ids, "torch"), atol=2e-4, rtol=1e-4)
    down = lm.model.mlx_model.model.layers[0].mlp.experts[0].down_proj
    assert down.mode == "mxfp4" and down.bits == 4 and "biases" not in down
    assert lm.model.mlx_model.conversion.formats.get("mxfp4") == 3 * lm.args.num_experts * lm.args.num_layers


def test_mlx_holds_mxfp4_as_its_own_mode_or_as_affine_bytes(monkeypatch):
    """One MXFP4 matrix converted for MLX: its "mxfp4" mode where MLX has it, else 8-bit affine bytes; both give the
    file's values bit for bit."""
    mx = pytest.importorskip("mlx.core")
    import numpy as np

    from engine.mlx_backend import quantized
    from engine.quant.weight import mxfp4_blocks
    from tests.kernels.test_quant_linear import _mxfp4_raw

    qt = mxfp4_blocks(_mxfp4_raw(8, 64), 64)
    want = qt.dequantize().numpy()
    native = quantized.convert(qt)
    assert (native.mode, native.bits, native.biases) == ("mxfp4", 4, None)
    got = mx.dequantize(native.weight, native.scales, group_size=32, bits=4, mode="mxfp4", dtype=mx.float32)
    assert np.array_equal(np.array(got), want)

    def no_mode(*args, mode="affine", **kw):
        if mode != "affine":
            raise ValueError(f"no mode {mode}")
        return quantize(*args, **kw)
    quantize = mx.quantize
    monkeypatch.setattr(mx, "quantize", no_mode)
    affine = quantized.convert(qt)
    assert (affine.mode, affine.bits) == ("affine", 8)
    got = mx.dequantize(affine.weight, affine.scales.astype(mx.float32), affine.biases.astype(mx.float32),
                        group_size=32, bits=8)
    assert np.array_equal(np.array(got), want)


def _assert_drift_within_llama_cpp(path):
    """The file held quantized: its logits no further from the file's exact values than llama.cpp's; the model."""
    pytest.importorskip("llama_cpp")
    lm = load_model(path, LoadOptions(weights="quantized"))
    exact, llama = check.against_llama_cpp(path, options=LoadOptions(weights="dequantized"))
    ours = (full_logits(lm, check.prompt()) - exact).abs().max()
    assert ours < 1.25 * (llama - exact).abs().max() + 0.01 * exact.abs().max(), (ours, (llama - exact).abs().max())
    return lm


@pytest.mark.parametrize("source", [0, 1])  # the folder's tokenizer, the file's
def test_harmony_answers_stream_as_a_thought_and_a_reply(files, source):
    """The model's tokens of a harmony answer, through the engine's text stream: the analysis channel as a thought, the
    final message as the reply, no markup; <|return|> ends the answer and <|end|> does not; an earlier answer goes
    back to the template without its thought."""
    from engine.text_stream import TextStream

    tok = load_model(files[source]).tokenizer
    assert tok.harmony
    assert tok.token_to_id("<|return|>") in tok.stop_ids and tok.token_to_id("<|end|>") not in tok.stop_ids
    ids = tok.encode("<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final"
                     "<|message|>Hello there!", add_bos=False)
    assert tok.token_to_id("<|channel|>") in ids  # the tags are single tokens, as the model writes them
    stream = TextStream(tok, [])
    assert "".join(stream.push(i) for i in ids) + stream.finish() == "<think>The user greets.</think>Hello there!"
    prompt = tok.decode(tok.apply_chat_template([{"role": "user", "content": "Hi"},
                                                 {"role": "assistant", "content": "<think>Greet.</think>Hello!"},
                                                 {"role": "user", "content": "Again"}]))
    assert "final<|message|>Hello!<|end|>" in prompt and "Greet" not in prompt and prompt.endswith("<|start|>assistant")
    # the thinking switch as harmony's reasoning effort (its template reads `reasoning_effort`)
    from engine.tokenizer.chat_template import ChatTemplate

    tok.chat_template = ChatTemplate("{{ reasoning_effort | default('medium') }}")
    efforts = [tok.decode(tok.apply_chat_template([{"role": "user", "content": "Hi"}], thinking=t)) for t in
               (None, False, True)]
    assert efforts == ["medium", "low", "high"]


def test_experts_stacked_for_the_device_give_the_module_path(files):
    """CUDA's path (every pair by index from stacked experts, each pair's expert's biases gathered, the clamped
    activation; here its PyTorch reference on the CPU) gives the expert-by-expert result: the decode graphs can
    capture the mixture."""
    from engine.models.moe import StackedExperts

    lm = load_model(files[1], LoadOptions(weights="dequantized"))
    moe = lm.model.model.layers[0].mlp
    for expert in moe.experts:
        expert.fuse_projections()
    x = torch.randn(7, lm.args.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = moe._routed(x)
        moe._stacked = StackedExperts.stack(moe.experts)
        assert moe.replayable and moe._stacked.glu is not None and moe._stacked.down_bias is not None
        got = moe._on_device(x, *moe.route(x))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_unsupported_layouts_are_refused_in_one_line(files):
    """A file whose experts' gate and up are fused (a newer converter's option) and a folder without its window size
    are refused naming what is wrong, before any weight is read."""
    from engine.errors import UnsupportedModelError
    from engine.models.gpt_oss import args_from_gguf

    meta = {"gpt-oss.expert_count": 8}
    with pytest.raises(UnsupportedModelError, match="fuses its experts' gate and up"):
        args_from_gguf(meta, {"blk.0.ffn_gate_up_exps.weight": (8, 64, 64)})
    with pytest.raises(UnsupportedModelError, match="no window size"):
        args_from_hf({**_config(), "sliding_window": None})


def test_on_mlx(files):
    pytest.importorskip("mlx.core")
    from tests.engine.test_mlx_backend import assert_mlx_matches_torch

    assert_mlx_matches_torch(load_model(files[0], LoadOptions(weights="dequantized")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights, kind", [("dequantized", 1), ("quantized", 3)])
def test_on_cuda(files, weights, kind):
    """bf16 and int8/int4 weights near the exact model, batched == alone, and decode steps replayed from CUDA graphs
    (the experts stacked on the device, their biases and activation included)."""
    from bench.runs import RunConfig, make_batcher

    lm = check.assert_on_cuda(files[kind], weights)
    assert all(layer.mlp.replayable for layer in lm.model.model.layers)
    assert make_batcher(lm, 2, RunConfig(max_seq_len=128)).runner.graphs is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mxfp4_experts_stay_4_bit_on_cuda(files, tmp_path):
    """A file's MXFP4 experts on CUDA: held as fp4 words (the file's values, 4.25 bits a weight; no notice) and
    multiplied by the same kernels as int4; near the exact model, batched == alone, decode steps replayed as graphs."""
    from bench.runs import RunConfig, make_batcher
    from tests.support.gguf_export import write_gguf

    path = write_gguf(files[0], tmp_path / "mxfp4.gguf", "Q8_0", overrides={"_exps.weight": "MXFP4"})
    lm = check.assert_on_cuda(path, "quantized")
    assert not any("MXFP4" in n for n in lm.notices)
    assert all(layer.mlp.replayable and layer.mlp._stacked.gate_up_format == "fp4" for layer in lm.model.model.layers)
    assert make_batcher(lm, 2, RunConfig(max_seq_len=128)).runner.graphs is not None
    # a folder of the same blocks (as openai's): fp4 on CUDA too (auto weights), its experts' bits the file's
    f32 = write_gguf(files[0], tmp_path / "mxfp4-f32.gguf", "F32", overrides={"_exps.weight": "MXFP4"})
    folder = _folder_from_gguf_experts(f32, files[0], tmp_path / "mxfp4-folder")
    options = LoadOptions(device="cuda", dtype="bfloat16")
    held, from_file = load_model(folder, options), load_model(f32, LoadOptions(device="cuda", dtype="bfloat16",
                                                                                weights="quantized"))
    for a, b in zip(held.model.model.layers, from_file.model.model.layers):
        for mine, theirs in zip(a.mlp.experts, b.mlp.experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                q, r = getattr(mine, proj).qweight, getattr(theirs, proj).qweight
                assert q.format == "fp4" and q.words.is_cuda and torch.equal(q.words, r.words), proj
                assert torch.equal(q.pairs, r.pairs)


def _config() -> dict:
    return {"hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300, "num_local_experts": 8,
            "num_experts_per_tok": 2, "sliding_window": 8, "max_position_embeddings": 512,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "truncate": False,
                                "original_max_position_embeddings": 64}}
