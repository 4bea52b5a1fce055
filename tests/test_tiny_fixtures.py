"""The tiny-model fixtures are what they claim: valid HF folders and llama.cpp-convention GGUFs."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from safetensors.numpy import load_file

from tests.support.gguf_export import llama3_rope_factors, permute_qk, write_gguf
from tests.support.tiny_models import ARCHS, TOK_SPECS, TinyModel, load_hf_reference, make_tiny_hf

pytestmark = pytest.mark.slow  # needs transformers

PROMPT = [[3, 17, 42, 99, 150, 7, 7, 8, 260, 301, 5, 64, 128, 200, 11, 12]]  # 16 tokens: crosses Gemma's window of 8

# What transformers' GGUF loader cannot recover from a llama.cpp-style file of our tiny models:
TRANSFORMERS_GAPS = {
    "llama": "rope_parameters",  # ignores the rope_freqs tensor, so llama3 rope scaling is lost
    "qwen2": None,
    "qwen3": "head_dim",  # maps qwen3.attention.key_length only for qwen3_moe; defaults head_dim to 128
    "gemma3": "query_pre_attn_scalar",  # defaults to 256; llama.cpp hard-codes 1/sqrt(head_dim)
}


def _config(m: TinyModel) -> dict:
    return json.loads((m.hf_dir / "config.json").read_text(encoding="utf-8"))


def _hf_weights(m: TinyModel) -> dict[str, np.ndarray]:
    return load_file(str(m.hf_dir / "model.safetensors"))


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def _tensors(path: Path) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(path)
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}


# -- HF folders


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_folder_reloads_with_finite_logits(tiny_models: dict[str, TinyModel], arch: str) -> None:
    m = tiny_models[arch]
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in m.hf_dir.iterdir()}
    model = load_hf_reference(m.hf_dir)
    assert not model.training and model.dtype == torch.float32
    with torch.no_grad():
        logits = model(torch.tensor(PROMPT)).logits
    assert logits.shape == (1, len(PROMPT[0]), _config(m)["vocab_size"])
    assert torch.isfinite(logits).all() and logits.std() > 0.1


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_weights_are_all_random(tiny_models: dict[str, TinyModel], arch: str) -> None:
    weights = _hf_weights(tiny_models[arch])
    for name, w in weights.items():
        # Default init (norms at 1 or 0, biases at 0) would let a loader that skips them pass.
        assert np.unique(w).size > w.size // 2, name
    if arch == "qwen2":
        assert any(name.endswith("q_proj.bias") for name in weights)
    if arch in ("qwen3", "gemma3"):
        assert any(name.endswith("q_norm.weight") for name in weights)


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_config_shape(tiny_models: dict[str, TinyModel], arch: str) -> None:
    cfg = _config(tiny_models[arch])
    assert cfg["dtype"] == "float32" and cfg["max_position_embeddings"] >= 256
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert cfg["tie_word_embeddings"] == (arch in ("qwen2", "gemma3"))
    if arch == "llama":
        assert cfg["rope_parameters"]["rope_type"] == "llama3"
    if arch == "gemma3":
        assert cfg["sliding_window"] == 8 and cfg["num_hidden_layers"] >= 6
        assert cfg["layer_types"][:6] == ["sliding_attention"] * 5 + ["full_attention"]
        assert cfg["query_pre_attn_scalar"] == cfg["head_dim"]


def test_tie_embeddings_override_and_seed(tmp_path: Path) -> None:
    a = make_tiny_hf("qwen3", tmp_path / "a", seed=1, tie_embeddings=True)
    b = make_tiny_hf("qwen3", tmp_path / "b", seed=1, tie_embeddings=True)
    c = make_tiny_hf("qwen3", tmp_path / "c", seed=2, tie_embeddings=True)
    wa, wb, wc = (load_file(str(d / "model.safetensors")) for d in (a, b, c))
    assert "lm_head.weight" not in wa and json.loads((a / "config.json").read_text())["tie_word_embeddings"]
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert not np.array_equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_tokenizer_and_chat_template(tiny_models: dict[str, TinyModel], arch: str) -> None:
    from transformers import AutoTokenizer

    m, spec = tiny_models[arch], TOK_SPECS[arch]
    tok = AutoTokenizer.from_pretrained(m.hf_dir)
    assert len(tok) == _config(m)["vocab_size"] and 300 <= len(tok) <= 600
    for special in spec.specials:
        assert tok.convert_tokens_to_ids(special) is not None and tok.encode(special, add_special_tokens=False) == \
            [tok.convert_tokens_to_ids(special)]
    ids = tok.encode("Hello wörld 123 🙂")
    assert (ids[0] == tok.bos_token_id) == spec.add_bos
    assert tok.decode(ids, skip_special_tokens=True) == "Hello wörld 123 🙂"
    tok_cfg = json.loads((m.hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert tok_cfg["chat_template"] == spec.chat_template and tok_cfg["eos_token"] == spec.eos
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.count("hi") >= 1 and any(end in chat for end in spec.gen_eos)


# -- GGUF header, tensors, vocab


def _expected_kv(arch: str, cfg: dict) -> dict:
    kv = {
        "general.architecture": arch,
        f"{arch}.context_length": cfg["max_position_embeddings"],
        f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.block_count": cfg["num_hidden_layers"],
        f"{arch}.feed_forward_length": cfg["intermediate_size"],
        f"{arch}.attention.head_count": cfg["num_attention_heads"],
        f"{arch}.attention.head_count_kv": cfg["num_key_value_heads"],
        f"{arch}.attention.layer_norm_rms_epsilon": pytest.approx(cfg["rms_norm_eps"]),
        "general.file_type": 0,
        "tokenizer.ggml.model": "gpt2",
    }
    rope = cfg["rope_parameters"].get("full_attention", cfg["rope_parameters"])
    kv[f"{arch}.rope.freq_base"] = pytest.approx(rope["rope_theta"])
    if "head_dim" in cfg:
        kv[f"{arch}.attention.key_length"] = kv[f"{arch}.attention.value_length"] = cfg["head_dim"]
    if arch == "llama":
        kv["llama.vocab_size"] = cfg["vocab_size"]
        kv["llama.rope.dimension_count"] = cfg["head_dim"]
    if arch == "gemma3":
        kv["gemma3.attention.sliding_window"] = cfg["sliding_window"]
    return kv


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_header(tiny_models: dict[str, TinyModel], arch: str) -> None:
    m = tiny_models[arch]
    reader = gguf.GGUFReader(m.gguf_path)
    for key, value in _expected_kv(arch, _config(m)).items():
        assert _field(reader, key) == value, key
    # Keys llama.cpp's converter does not write for these archs.
    if arch != "llama":
        assert f"{arch}.vocab_size" not in reader.fields and f"{arch}.rope.dimension_count" not in reader.fields
    assert not any(".rope.scaling." in key for key in reader.fields)
    assert "qwen2.attention.key_length" not in reader.fields


def _expected_tensor_names(arch: str, cfg: dict) -> set[str]:
    per_block = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down"]
    if arch in ("qwen3", "gemma3"):
        per_block += ["attn_q_norm", "attn_k_norm"]
    if arch == "gemma3":
        per_block += ["post_attention_norm", "post_ffw_norm"]
    names = {f"blk.{i}.{t}.weight" for i in range(cfg["num_hidden_layers"]) for t in per_block}
    if arch == "qwen2":
        names |= {f"blk.{i}.attn_{x}.bias" for i in range(cfg["num_hidden_layers"]) for x in "qkv"}
    names |= {"token_embd.weight", "output_norm.weight"}
    if not cfg["tie_word_embeddings"]:
        names.add("output.weight")
    if arch == "llama":
        names.add("rope_freqs.weight")
    return names


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_tensor_names_and_shapes(tiny_models: dict[str, TinyModel], arch: str) -> None:
    m, cfg = tiny_models[arch], _config(tiny_models[arch])
    reader = gguf.GGUFReader(m.gguf_path)
    assert {t.name for t in reader.tensors} == _expected_tensor_names(arch, cfg)
    by_name = {t.name: t for t in reader.tensors}
    q_rows = cfg["num_attention_heads"] * cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    # GGUF lists dims fastest-first: (in_features, out_features).
    assert list(by_name["blk.0.attn_q.weight"].shape) == [cfg["hidden_size"], q_rows]
    assert list(by_name["token_embd.weight"].shape) == [cfg["hidden_size"], cfg["vocab_size"]]
    assert all(t.tensor_type == QType.F32 for t in reader.tensors)


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_tensor_values(tiny_models: dict[str, TinyModel], arch: str) -> None:
    m, cfg = tiny_models[arch], _config(tiny_models[arch])
    hf, stored = _hf_weights(m), _tensors(m.gguf_path)
    n_layers = cfg["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_layers)
    for hf_name, w in hf.items():
        got = stored[names.get_name(hf_name, try_suffixes=(".weight", ".bias"))]
        assert got.shape == w.shape, hf_name
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            np.testing.assert_array_equal(got, w + 1.0)  # the converter folds Gemma's (1 + w) into the file
        elif arch == "llama" and hf_name.endswith("q_proj.weight"):
            heads = cfg["num_attention_heads"]
            np.testing.assert_array_equal(got, permute_qk(w, heads, heads))
            assert not np.array_equal(got, w)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            np.testing.assert_array_equal(got, permute_qk(w, cfg["num_attention_heads"], cfg["num_key_value_heads"]))
        else:
            np.testing.assert_array_equal(got, w, err_msg=hf_name)


def test_llama_permute_is_half_split_to_interleaved() -> None:
    # Per head, HF rows (x0..x3 | y0..y3) become (x0 y0 x1 y1 ...): rope pairs sit side by side.
    w = np.arange(16, dtype=np.float32).reshape(16, 1)
    got = permute_qk(w, 2, 2)[:, 0]
    np.testing.assert_array_equal(got[:8], [0, 4, 1, 5, 2, 6, 3, 7])
    np.testing.assert_array_equal(got[8:], [8, 12, 9, 13, 10, 14, 11, 15])


def test_llama_rope_freqs_match_transformers(tiny_models: dict[str, TinyModel]) -> None:
    m = tiny_models["llama"]
    cfg = _config(m)
    stored = _tensors(m.gguf_path)["rope_freqs.weight"]
    np.testing.assert_array_equal(stored, llama3_rope_factors(cfg))
    assert {1.0, 8.0} <= set(stored.tolist()) and len(set(stored.tolist())) >= 3  # all three llama3 bands
    dim, base = cfg["head_dim"], cfg["rope_parameters"]["rope_theta"]
    plain = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv_freq = load_hf_reference(m.hf_dir).model.rotary_emb.inv_freq
    torch.testing.assert_close(plain / torch.from_numpy(stored.copy()), inv_freq, rtol=1e-5, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_vocab(tiny_models: dict[str, TinyModel], arch: str) -> None:
    from tokenizers import Tokenizer

    m, spec = tiny_models[arch], TOK_SPECS[arch]
    reader = gguf.GGUFReader(m.gguf_path)
    tok = Tokenizer.from_file(str(m.hf_dir / "tokenizer.json"))
    tokens, types = _field(reader, "tokenizer.ggml.tokens"), _field(reader, "tokenizer.ggml.token_type")
    assert tokens == [tok.id_to_token(i) for i in range(tok.get_vocab_size())]
    control = {tok.token_to_id(s) for s in spec.specials}
    assert types == [3 if i in control else 1 for i in range(len(tokens))]
    merges = json.loads((m.hf_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["merges"]
    assert len(_field(reader, "tokenizer.ggml.merges")) == len(merges) > 50
    expect_pre = {"llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2", "gemma3": "default"}[arch]
    assert _field(reader, "tokenizer.ggml.pre") == expect_pre
    assert _field(reader, "tokenizer.ggml.eos_token_id") == tok.token_to_id(spec.eos)
    if spec.bos:
        assert _field(reader, "tokenizer.ggml.bos_token_id") == tok.token_to_id(spec.bos)
    assert _field(reader, "tokenizer.ggml.add_bos_token") == spec.add_bos
    assert _field(reader, "tokenizer.chat_template") == spec.chat_template


# -- other tensor types


@pytest.mark.parametrize("arch", ARCHS)
def test_q8_0_dequantizes_close_to_f32(tiny_models: dict[str, TinyModel], tiny_models_q8: dict[str, TinyModel],
                                       arch: str) -> None:
    reader = gguf.GGUFReader(tiny_models_q8[arch].gguf_path)
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    for t in reader.tensors:
        # llama.cpp keeps 1-D tensors (norms, biases, rope_freqs) in F32.
        assert t.tensor_type == (QType.Q8_0 if len(t.shape) == 2 else QType.F32), t.name
    f32, q8 = _tensors(tiny_models[arch].gguf_path), _tensors(tiny_models_q8[arch].gguf_path)
    for name, ref in f32.items():
        scale = np.abs(ref).max()
        np.testing.assert_allclose(q8[name], ref, atol=scale / 127 * 0.6, err_msg=name)


@pytest.mark.parametrize("tensor_type", ["F16", "BF16"])
def test_half_precision_types(tiny_models: dict[str, TinyModel], tmp_path: Path, tensor_type: str) -> None:
    m = tiny_models["qwen2"]
    path = write_gguf(m.hf_dir, tmp_path / f"qwen2-{tensor_type}.gguf", tensor_type)
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:
        assert t.tensor_type == (QType[tensor_type] if len(t.shape) == 2 else QType.F32), t.name
    f32, half = _tensors(m.gguf_path), _tensors(path)
    for name, ref in f32.items():
        np.testing.assert_allclose(half[name], ref, rtol=1e-2, atol=1e-3, err_msg=name)


# -- cross-check with transformers' own GGUF loader (it undoes llama.cpp's conventions)


@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_loads_our_gguf(tiny_models: dict[str, TinyModel], arch: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    m = tiny_models[arch]
    ref = load_hf_reference(m.hf_dir)
    config = AutoConfig.from_pretrained(m.gguf_path.parent, gguf_file=m.gguf_path.name)
    if (gap := TRANSFORMERS_GAPS[arch]) is not None:
        setattr(config, gap, getattr(ref.config, gap))
    model = AutoModelForCausalLM.from_pretrained(m.gguf_path.parent, gguf_file=m.gguf_path.name, config=config,
                                                 dtype=torch.float32).eval()
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    text = "Hello wörld 12345 def f(x):\n  return x*2 🙂"
    tok_gguf = AutoTokenizer.from_pretrained(m.gguf_path.parent, gguf_file=m.gguf_path.name)
    assert tok_gguf(text).input_ids == AutoTokenizer.from_pretrained(m.hf_dir)(text).input_ids


# -- corrupt files


def test_corrupt_variants(corrupt_ggufs: dict[str, Path], tiny_models: dict[str, TinyModel]) -> None:
    good = tiny_models["llama"].gguf_path
    good_reader = gguf.GGUFReader(good)
    size = good.stat().st_size
    paths = corrupt_ggufs
    assert set(paths) == {"truncated", "header_only", "bad_magic", "empty", "unsupported_arch",
                          "unsupported_tensor_type", "mixture_of_experts"}
    experts = gguf.GGUFReader(paths["mixture_of_experts"])
    assert experts.fields["llama.expert_count"].contents() == 8 and len(experts.tensors) == len(good_reader.tensors)
    assert good_reader.data_offset < paths["truncated"].stat().st_size < size
    assert 24 < paths["header_only"].stat().st_size < good_reader.fields["tokenizer.ggml.merges"].offset
    assert paths["bad_magic"].read_bytes()[:4] != b"GGUF" and paths["bad_magic"].stat().st_size == size
    assert paths["empty"].stat().st_size == 0
    for key in ("truncated", "header_only", "bad_magic", "empty"):
        with pytest.raises((ValueError, OSError)):
            gguf.GGUFReader(paths[key])


def test_unsupported_arch_variant(corrupt_ggufs: dict[str, Path], tiny_models: dict[str, TinyModel]) -> None:
    reader = gguf.GGUFReader(corrupt_ggufs["unsupported_arch"])
    good = gguf.GGUFReader(tiny_models["llama"].gguf_path)
    assert _field(reader, "general.architecture") == "mamba9000"
    assert _field(reader, "mamba9000.block_count") == _field(good, "llama.block_count")
    assert [t.name for t in reader.tensors] == [t.name for t in good.tensors]


def test_unsupported_tensor_type_variant(corrupt_ggufs: dict[str, Path]) -> None:
    reader = gguf.GGUFReader(corrupt_ggufs["unsupported_tensor_type"])
    odd = [t for t in reader.tensors if t.tensor_type != QType.F32]
    assert [t.name for t in odd] == ["blk.0.attn_q.weight"]
    with pytest.raises(NotImplementedError):
        gguf.quants.dequantize(odd[0].data, odd[0].tensor_type)
