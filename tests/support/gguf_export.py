"""Write a tiny HF folder as GGUF the way llama.cpp's convert_hf_to_gguf.py does, plus broken variants.

Mirrors the converter's per-arch choices: which header keys each arch gets, the Q/K row permutation
for 'llama' only, the +1 folded into Gemma norms, llama3 rope as a `rope_freqs` tensor, and the
"gpt2" (byte-level BPE) vocab with merges, special ids and chat template from gguf.SpecialVocab.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QType, GGUFWriter, LlamaFileType, MODEL_ARCH, TokenType
from safetensors.numpy import load_file

GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "gemma3": "gemma3",
             "phi3": "phi3", "gemma2": "gemma2", "granite": "granite", "smollm3": "smollm3",
             "olmo2": "olmo2", "olmo3": "olmo2", "cohere": "command-r", "cohere2": "cohere2",
             "stablelm": "stablelm", "starcoder2": "starcoder2", "exaone": "exaone", "exaone4": "exaone4",
             "seed_oss": "seed_oss", "ernie4_5": "ernie4_5", "ernie4_5_moe": "ernie4_5-moe", "glm4": "glm4",
             "arcee": "arcee", "glm4_moe": "glm4moe", "gpt_oss": "gpt-oss",
             "qwen3_moe": "qwen3moe", "mixtral": "llama", "olmoe": "olmoe",
             "qwen2_moe": "qwen2moe", "granitemoe": "granitemoe", "mistral": "llama"}
MODEL_ARCHES = {"llama": MODEL_ARCH.LLAMA, "qwen2": MODEL_ARCH.QWEN2, "qwen3": MODEL_ARCH.QWEN3,
                "gemma3": MODEL_ARCH.GEMMA3, "phi3": MODEL_ARCH.PHI3,
                "gemma2": MODEL_ARCH.GEMMA2, "granite": MODEL_ARCH.GRANITE, "smollm3": MODEL_ARCH.SMOLLM3,
                "olmo2": MODEL_ARCH.OLMO2, "command-r": MODEL_ARCH.COMMAND_R,
                "cohere2": MODEL_ARCH.COHERE2, "stablelm": MODEL_ARCH.STABLELM,
                "starcoder2": MODEL_ARCH.STARCODER2, "exaone": MODEL_ARCH.EXAONE, "exaone4": MODEL_ARCH.EXAONE4,
                "seed_oss": MODEL_ARCH.SEED_OSS, "ernie4_5": MODEL_ARCH.ERNIE4_5,
                "ernie4_5-moe": MODEL_ARCH.ERNIE4_5_MOE, "glm4": MODEL_ARCH.GLM4, "arcee": MODEL_ARCH.ARCEE,
                "glm4moe": MODEL_ARCH.GLM4_MOE, "gpt-oss": MODEL_ARCH.GPT_OSS,
                "qwen3moe": MODEL_ARCH.QWEN3MOE,
                "olmoe": MODEL_ARCH.OLMOE, "qwen2moe": MODEL_ARCH.QWEN2MOE, "granitemoe": MODEL_ARCH.GRANITE_MOE}
TOKENIZER_PRE = {"llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2", "gemma3": "default", "phi3": "qwen2",
                 "gemma2": "default", "granite": "refact", "smollm3": "llama-bpe",
                 "olmo2": "dbrx", "command-r": "command-r", "cohere2": "command-r", "stablelm": "stablelm2",
                 "starcoder2": "starcoder", "exaone": "exaone", "exaone4": "exaone4", "seed_oss": "seed-coder",
                 "ernie4_5": "default", "ernie4_5-moe": "default", "glm4": "glm4", "arcee": "llama-bpe",
                 "glm4moe": "glm4", "gpt-oss": "gpt-4o",
                 "qwen3moe": "qwen2", "olmoe": "dbrx", "qwen2moe": "qwen2", "granitemoe": "refact"}
TENSOR_TYPES = {"F32": (QType.F32, LlamaFileType.ALL_F32), "F16": (QType.F16, LlamaFileType.MOSTLY_F16),
                "BF16": (QType.BF16, LlamaFileType.MOSTLY_BF16), "Q8_0": (QType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
                "Q4_0": (QType.Q4_0, LlamaFileType.MOSTLY_Q4_0), "Q4_1": (QType.Q4_1, LlamaFileType.MOSTLY_Q4_1),
                "MXFP4": (QType.MXFP4, LlamaFileType.MOSTLY_MXFP4_MOE)}
# converted by LlamaModel or a subclass: Q/K rows permuted
LLAMA_LIKE = ("llama", "granite", "granitemoe", "smollm3", "arcee")
EXPERT = re.compile(r"(model\.layers\.\d+\.(?:mlp|block_sparse_moe))\.experts\.(\d+)\.(\w+)\.weight")
UNSUPPORTED_QTYPE = QType.Q8_1  # a real ggml type that gguf.quants.dequantize has no kernel for


def write_gguf(hf_dir: Path, out_path: Path, tensor_type: str = "F32", overrides: dict[str, str] | None = None) -> Path:
    """Convert the HF folder at `hf_dir` to a GGUF at `out_path` (a key of TENSOR_TYPES); `overrides` maps a part of a
    tensor's name to another key (a Q4_K_M file's "more bits" attn_v: {"attn_v": "Q8_0"})."""
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    cfg = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    arch = _gguf_arch(cfg)
    qtype, ftype = TENSOR_TYPES[tensor_type]
    writer = GGUFWriter(out_path, arch)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(hf_dir.name)
    _write_hparams(writer, arch, cfg)
    writer.add_file_type(ftype)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_vocab = _write_vocab(writer, hf_dir, arch)
    for name, data in _converted_tensors(hf_dir, arch, cfg, n_vocab):
        own = next((TENSOR_TYPES[t][0] for part, t in (overrides or {}).items() if part in name), qtype)
        _add_tensor(writer, name, data, own)
    _finish(writer)
    return out_path


def _gguf_arch(cfg: dict) -> str:
    if cfg["model_type"] == "granitemoehybrid":  # GraniteHybridModel: without Mamba layers, granite or granitemoe
        return "granitemoe" if cfg.get("num_local_experts") else "granite"
    return GGUF_ARCH[cfg["model_type"]]


def _finish(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# -- header


def _rope(cfg: dict, layer_type: str = "full_attention") -> dict:
    # v5 configs keep rope in rope_parameters (per layer type for Gemma 3); older ones use rope_theta/rope_scaling.
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    params = params.get(layer_type, params)
    if "rope_theta" not in params and "rope_theta" in cfg:
        params = {**params, "rope_theta": cfg["rope_theta"]}
    return params


def _head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def _write_hparams(w: GGUFWriter, arch: str, cfg: dict) -> None:
    if arch == "gemma3":
        _write_gemma3_hparams(w, cfg)
        return
    if arch == "phi3":
        _write_phi3_hparams(w, cfg)
        return
    if arch == "gemma2":
        _write_gemma2_hparams(w, cfg)
        return
    if arch == "stablelm":
        _write_stablelm_hparams(w, cfg)
        return
    if arch == "exaone":
        _write_exaone_hparams(w, cfg)
        return
    # TextModel.set_gguf_parameters: shared by llama, qwen2 and qwen3.
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    w.add_rope_freq_base(_rope(cfg).get("rope_theta", 10000.0))
    if _rope(cfg).get("rope_type") == "yarn":  # TextModel's (Qwen2Model's before it): the factor, the original context
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(_rope(cfg)["factor"])
        w.add_rope_scaling_orig_ctx_len(_rope(cfg)["original_max_position_embeddings"])
    if experts := cfg.get("num_experts", cfg.get("num_local_experts")):  # TextModel's, then Qwen2MoeModel's
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if "shared_expert_intermediate_size" in cfg:
            w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if arch == "starcoder2":  # TextModel's: a LayerNorm eps (norm_epsilon), no sliding window
        w.add_layer_norm_eps(cfg["norm_epsilon"])
        return
    if arch in ("command-r", "cohere2"):  # CommandR2Model, Cohere2Model: Q/K rows kept (interleaved in HF)
        w.add_layer_norm_eps(cfg["layer_norm_eps"])
        w.add_logit_scale(cfg["logit_scale"])
        if arch == "cohere2":
            w.add_sliding_window(cfg["sliding_window"])
            w.add_vocab_size(cfg["vocab_size"])
            w.add_rope_dimension_count(_head_dim(cfg))
        return
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if cfg.get("head_dim") is not None:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if arch == "ernie4_5-moe":  # Ernie4_5MoeModel.set_gguf_parameters: TextModel's, then the experts' layout
        w.add_expert_count(cfg["moe_num_experts"])
        w.add_expert_used_count(cfg["moe_k"])
        w.add_interleave_moe_layer_step(cfg["moe_layer_interval"])
        w.add_leading_dense_block_count(cfg["moe_layer_start_index"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_count(cfg["moe_num_shared_experts"])
        w.add_expert_shared_feed_forward_length(cfg["moe_intermediate_size"] * cfg["moe_num_shared_experts"])
    if arch == "glm4moe":  # Glm4MoeModel.set_gguf_parameters: TextModel's, then the experts' layout and routing
        w.add_rope_dimension_count(int(_head_dim(cfg) * _rope(cfg)["partial_rotary_factor"]))
        w.add_expert_count(cfg["n_routed_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_nextn_predict_layers(0)  # the tiny model has none
    if arch == "gpt-oss":  # GptOssModel.set_gguf_parameters: TextModel's, the window, the experts' width
        w.add_sliding_window(cfg["sliding_window"])
        w.add_expert_feed_forward_length(cfg["intermediate_size"])
    if arch == "glm4":  # Glm4Model.set_gguf_parameters: TextModel's, the rotated dims
        w.add_rope_dimension_count(int(_head_dim(cfg) * _rope(cfg)["partial_rotary_factor"]))
    if arch == "exaone4":  # Exaone4Model.set_gguf_parameters: TextModel's, the vocabulary size, the window
        w.add_vocab_size(cfg["vocab_size"])
    if arch in ("olmo2", "exaone4") and cfg.get("sliding_window"):  # Olmo2Model (OLMo 3), Exaone4Model: a flag per layer
        if "attention_factor" in _rope(cfg):
            w.add_rope_scaling_yarn_attn_factor(_rope(cfg)["attention_factor"])
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
    if arch == "granitemoe" and cfg.get("shared_intermediate_size"):  # GraniteMoeModel's shared expert
        w.add_expert_shared_feed_forward_length(cfg["shared_intermediate_size"])
    if arch in ("granite", "granitemoe"):  # GraniteModel.set_gguf_parameters: LlamaModel's, the scalars
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    if arch in LLAMA_LIKE:
        # LlamaModel.set_gguf_parameters adds these; llama3 rope goes into the rope_freqs tensor instead.
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(_head_dim(cfg))
        if _rope(cfg).get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(_rope(cfg)["factor"])


def _write_exaone_hparams(w: GGUFWriter, cfg: dict) -> None:
    # ExaoneModel.set_gguf_parameters (its own config keys); llama3 rope goes into the rope_freqs tensor
    w.add_embedding_length(cfg["hidden_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_layer_norm_rms_eps(cfg["layer_norm_epsilon"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_layers"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_rope_dimension_count(_head_dim(cfg))


def _write_stablelm_hparams(w: GGUFWriter, cfg: dict) -> None:
    # StableLMModel.set_gguf_parameters: no rope base (llama.cpp's default, 10000), the rotated share as a dim count
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(int(_rope(cfg)["partial_rotary_factor"] * _head_dim(cfg)))
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_parallel_residual(cfg["use_parallel_residual"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])


def _write_phi3_hparams(w: GGUFWriter, cfg: dict) -> None:
    # Phi3MiniModel.set_gguf_parameters; LongRoPE's attention factor and factor tensors come with the tensors
    rope = _rope(cfg)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_rope_scaling_orig_ctx_len(rope.get("original_max_position_embeddings")
                                    or cfg.get("original_max_position_embeddings") or cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(int(_head_dim(cfg) * (rope.get("partial_rotary_factor")
                                                      or cfg.get("partial_rotary_factor") or 1.0)))
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_sliding_window(cfg.get("sliding_window") or 0)
    if rope.get("rope_type") == "longrope":
        original = rope.get("original_max_position_embeddings") or cfg["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / original
        w.add_rope_scaling_attn_factors(1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original)))


def _write_gemma2_hparams(w: GGUFWriter, cfg: dict) -> None:
    # Gemma2Model.set_gguf_parameters: no rope base (llama.cpp's 10000), the 1:1 sliding pattern hard-coded
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    w.add_sliding_window(cfg["sliding_window"])


def _write_gemma3_hparams(w: GGUFWriter, cfg: dict) -> None:
    # Gemma3Model.set_gguf_parameters; llama.cpp hard-codes the 5:1 sliding pattern, the local rope
    # base (10000) and 1/sqrt(head_dim) query scaling, so none of those are written.
    w.add_context_length(cfg.get("max_position_embeddings", 131072))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg.get("num_attention_heads", 8))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_key_length(cfg.get("head_dim", 256))
    w.add_value_length(cfg.get("head_dim", 256))
    w.add_rope_freq_base(_rope(cfg).get("rope_theta", 1_000_000.0))
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if cfg.get("sliding_window_pattern") != 1:
        w.add_sliding_window(cfg["sliding_window"])
    w.add_head_count_kv(cfg.get("num_key_value_heads", 4))
    if _rope(cfg).get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(_rope(cfg)["factor"])


# -- vocab


def _write_vocab(w: GGUFWriter, hf_dir: Path, arch: str) -> int:
    tokens, toktypes = _vocab_tokens(hf_dir)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(TOKENIZER_PRE[arch])
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    # The converter's own reader for merges, bos/eos/pad ids, add_bos_token and chat_template.
    gguf.SpecialVocab(hf_dir, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)
    return len(tokens)


def _vocab_tokens(hf_dir: Path) -> tuple[list[str], list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    reverse = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    added = tok.get_added_tokens_decoder()
    tokens, types = [], []
    for i in range(max(reverse) + 1):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(TokenType.CONTROL if added[i].special else TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(TokenType.NORMAL)
    return tokens, [int(t) for t in types]


# -- tensors


def _converted_tensors(hf_dir: Path, arch: str, cfg: dict, n_vocab: int):
    """Yield (gguf_name, float32 array) in the converter's conventions (float32 safetensors only)."""
    if arch in ("llama", "exaone", "exaone4") and _rope(cfg).get("rope_type") == "llama3":
        yield "rope_freqs.weight", llama3_rope_factors(cfg)
    if arch == "phi3" and _rope(cfg).get("rope_type") == "longrope":
        yield "rope_factors_long.weight", np.asarray(_rope(cfg)["long_factor"], dtype=np.float32)
        yield "rope_factors_short.weight", np.asarray(_rope(cfg)["short_factor"], dtype=np.float32)
    weights = load_file(str(hf_dir / "model.safetensors"))
    names = gguf.get_tensor_name_map(MODEL_ARCHES[arch], cfg.get("num_hidden_layers", cfg.get("num_layers")))
    experts: dict[str, dict[int, np.ndarray]] = {}
    n_experts = cfg.get("num_experts", cfg.get("num_local_experts", cfg.get("moe_num_experts",
                                                                            cfg.get("n_routed_experts"))))
    for hf_name in sorted(weights, key=_layer_order):
        data = weights[hf_name].astype(np.float32)
        if hf_name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        if hf_name.endswith("e_score_correction_bias"):  # Ernie4_5MoeModel: the selection bias, squeezed to (E,)
            yield f"blk.{hf_name.split('.')[2]}.exp_probs_b.bias", data.reshape(-1)
            continue
        if ".shared_mlp." in hf_name:  # GraniteMoeModel: its gate rows, then up rows; the dense MLP without experts
            layer, suffix = int(hf_name.split(".")[2]), "_shexp" if cfg.get("num_local_experts") else ""
            if hf_name.endswith("input_linear.weight"):
                gate, up = np.split(data, 2, axis=-2)
                yield f"blk.{layer}.ffn_gate{suffix}.weight", gate
                yield f"blk.{layer}.ffn_up{suffix}.weight", up
            else:
                yield f"blk.{layer}.ffn_down{suffix}.weight", data
            continue
        if hf_name.endswith("block_sparse_moe.input_linear.weight"):  # GraniteMoeModel: gate rows, then up rows
            layer = int(hf_name.split(".")[2])
            gate, up = np.split(data, 2, axis=-2)
            yield f"blk.{layer}.ffn_gate_exps.weight", gate
            yield f"blk.{layer}.ffn_up_exps.weight", up
            continue
        if arch == "gpt-oss" and ".mlp.experts." in hf_name:  # GptOssModel: gate/up de-interleaved, (out, in) rows
            yield from _gpt_oss_experts(hf_name, data)
            continue
        if arch == "gpt-oss" and hf_name.endswith(".sinks"):  # GptOssModel.filter_tensors: a ".weight" name
            yield f"blk.{hf_name.split('.')[2]}.attn_sinks.weight", data
            continue
        if m := EXPERT.fullmatch(hf_name):  # the converters stack each projection's experts into one tensor
            stack = experts.setdefault(f"{m.group(1)}.experts.{m.group(3)}.weight", {})
            stack[int(m.group(2))] = data
            if len(stack) < n_experts:
                continue
            hf_name, data = f"{m.group(1)}.experts.{m.group(3)}.weight", np.stack([stack[e] for e in range(n_experts)])
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"cannot map HF tensor {hf_name!r} for {arch}")
        yield gguf_name, _transform(arch, cfg, hf_name, data, n_vocab)


def _gpt_oss_experts(hf_name: str, data: np.ndarray):
    """GptOssModel.modify_tensors of a float (not MXFP4) checkpoint: weights (E, in, out) -> (E, out, in); gate/up
    rows and biases interleaved in HF, apart in the file."""
    layer, kind = hf_name.split(".")[2], hf_name.rpartition(".")[2]
    bias = kind.endswith("_bias")
    if kind.startswith("gate_up_proj"):
        rows = data if bias else data.swapaxes(-1, -2)
        for part, at in (("gate", 0), ("up", 1)):
            yield f"blk.{layer}.ffn_{part}_exps.{'bias' if bias else 'weight'}", np.ascontiguousarray(rows[:, at::2])
    else:
        yield f"blk.{layer}.ffn_down_exps.{'bias' if bias else 'weight'}", \
            np.ascontiguousarray(data if bias else data.swapaxes(-1, -2))


def _layer_order(name: str) -> tuple[int, str]:
    parts = name.split(".")
    layer = int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else (-1 if "embed" in name else 10**6)
    return layer, name


def _transform(arch: str, cfg: dict, hf_name: str, data: np.ndarray, n_vocab: int) -> np.ndarray:
    if arch in LLAMA_LIKE and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
        return permute_qk(data, cfg["num_attention_heads"], cfg["num_attention_heads"])
    if arch in LLAMA_LIKE and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
        return permute_qk(data, cfg["num_attention_heads"], cfg.get("num_key_value_heads"))
    if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
        return data + 1.0  # Gemma's RMSNorm computes x * (1 + w)
    if arch.startswith("gemma") and hf_name.endswith("embed_tokens.weight"):
        return data[:n_vocab]  # the converter drops embedding rows past the tokenizer's vocab
    return data


def permute_qk(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF's half-split rope rows -> GGML's interleaved (adjacent pair) rows."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    shape = weights.shape
    return weights.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """The per-frequency divisors llama.cpp stores as rope_freqs.weight for llama3 rope scaling."""
    rope, dim = _rope(cfg), _head_dim(cfg)
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_ctx = rope.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _storage_type(name: str, data: np.ndarray, qtype: QType) -> QType:
    # Converter rule: 1-D tensors, norms and anything not a ".weight" (biases, rope_freqs) stay F32.
    # A mixture's router too (prepare_tensors keeps FFN_GATE_INP in F32).
    if data.ndim <= 1 or name.endswith(("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")) \
            or not name.endswith(".weight"):
        return QType.F32
    return qtype


def _add_tensor(w: GGUFWriter, name: str, data: np.ndarray, qtype: QType) -> None:
    qtype = _storage_type(name, data, qtype)
    try:
        stored = gguf.quants.quantize(data, qtype)
    except gguf.QuantError:
        qtype = QType.F16  # the converter's fallback for rows not divisible by the block size
        stored = gguf.quants.quantize(data, qtype)
    if qtype in (QType.F32, QType.F16):
        w.add_tensor(name, stored)
    else:
        w.add_tensor(name, stored, raw_dtype=qtype)


# -- broken files for error-path tests


def write_corrupt_variants(good_gguf: Path, out_dir: Path) -> dict[str, Path]:
    """Damaged or unsupported copies of `good_gguf`, keyed by what is wrong with them."""
    good_gguf, out_dir = Path(good_gguf), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blob = good_gguf.read_bytes()
    reader = gguf.GGUFReader(good_gguf)
    paths = {
        "truncated": _write_bytes(out_dir / "truncated.gguf", blob[: (reader.data_offset + len(blob)) // 2]),
        "header_only": _write_bytes(out_dir / "header_only.gguf", blob[: _mid_metadata_offset(reader)]),
        "bad_magic": _write_bytes(out_dir / "bad_magic.gguf", b"GGUX" + blob[4:]),
        "empty": _write_bytes(out_dir / "empty.gguf", b""),
    }
    paths["unsupported_arch"] = rewrite_gguf(reader, out_dir / "unsupported_arch.gguf", arch="mamba9000")
    paths["unsupported_tensor_type"] = rewrite_gguf(reader, out_dir / "unsupported_tensor_type.gguf",
                                                retype="blk.0.attn_q.weight")
    arch = reader.fields["general.architecture"].contents()
    paths["mixture_of_experts"] = rewrite_gguf(reader, out_dir / "mixture_of_experts.gguf",  # Mixtral's keys, no experts
                                           extra={f"{arch}.expert_count": 8, f"{arch}.expert_used_count": 2})
    return paths


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mid_metadata_offset(reader: gguf.GGUFReader) -> int:
    # Halfway through the token list: the key/value section is cut, no tensor info survives.
    field = reader.fields["tokenizer.ggml.tokens"]
    size = sum(part.nbytes for part in field.parts)
    return field.offset + size // 2


def rewrite_gguf(reader: gguf.GGUFReader, path: Path, arch: str | None = None, retype: str | None = None,
             extra: dict[str, int | float | str | list] | None = None) -> Path:
    """Copy a GGUF field by field and tensor by tensor, optionally renaming the arch, retyping one tensor or setting
    integer, float, string or array keys."""
    old_arch = reader.fields["general.architecture"].contents()
    new_arch = arch or old_arch
    writer = GGUFWriter(path, new_arch)
    copy_fields(reader, writer, lambda key: key in (extra or {}), new_arch)
    for key, value in (extra or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_uint32(key, value)
    for t in reader.tensors:
        _copy_tensor(writer, t, unsupported=(t.name == retype))
    _finish(writer)
    return path


def copy_fields(reader: gguf.GGUFReader, writer: GGUFWriter, skip=lambda key: False, arch: str | None = None) -> None:
    """Every metadata field of `reader` but the file's own and those `skip` names, under `arch` when given."""
    old_arch = reader.fields["general.architecture"].contents()
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or skip(key):
            continue
        new_key = arch + key[len(old_arch):] if arch and key.startswith(old_arch + ".") else key
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(new_key, field.contents(), field.types[0], sub_type=sub_type)


def _copy_tensor(writer: GGUFWriter, t, unsupported: bool) -> None:
    shape = [int(n) for n in reversed(t.shape)]  # GGUF lists dims fastest-first; numpy wants them last
    if unsupported:
        block, type_size = gguf.GGML_QUANT_SIZES[UNSUPPORTED_QTYPE]
        raw = np.zeros((*shape[:-1], shape[-1] // block * type_size), dtype=np.uint8)
        writer.add_tensor(t.name, raw, raw_dtype=UNSUPPORTED_QTYPE)
    elif t.tensor_type in (QType.F32, QType.F16):
        writer.add_tensor(t.name, np.asarray(t.data).reshape(shape))
    else:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)

