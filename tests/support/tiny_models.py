"""Tiny random-weight transformers models (llama, qwen2, qwen3, gemma3) saved as Hugging Face folders.

Every weight, norms and biases included, is random with a fixed seed: default init leaves norms at
1 (or 0 for Gemma) and biases at 0, which would let a loader that drops them still pass.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")

BPE_VOCAB_SIZE = 400  # byte alphabet (256) + ~140 merges; specials come on top for llama/qwen

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set first_user_prefix = messages[0]['content'] | trim + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set first_user_prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '')"
    " + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.
It was the best of times, it was the worst of times; it was the age of wisdom.
Local language models run on your own computer, so your conversations never leave it.
A chat app batches every live conversation into one forward pass per step.
Don't panic! We'll see what they've done, and I'm sure you'd agree it's fine.

def fibonacci(n: int) -> list[int]:
    a, b = 0, 1
    out = []
    for _ in range(n):
        out.append(a)
        a, b = b, a + b
    return out

class Cache:
    def __init__(self, slots):
        self.slots = {i: None for i in range(slots)}
    def free(self):
        return [k for k, v in self.slots.items() if v is None]

if (x > 0 && y < 10) { printf("%d\\n", x * y); } else { return -1; }
SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;
{"role": "user", "content": "hello"} [1, 2, 3] <div class="msg">Hi</div>

Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 65536 3.14159 2.71828 -17 1e-6 0x1F 1,000,000
Dates: 2024-01-15, 1999-12-31 23:59:59, 12/05/2023. Phone: +1 (555) 123-4567.
Unicode: café naïve résumé façade Zürich Ålesund Øresund straße. Ελληνικά λέξεις. Русский текст.
日本語のテキスト。中文文本。한국어 텍스트. Emoji: 🙂 🚀 ✨ ❤️ 👍🏽. Math: ∑ ∫ √ ∞ ≤ ≥ ≠ π → ←.
Tabs\tand   multiple   spaces, trailing spaces   
and blank lines.


Mixed: naïve_café = résumé + 42; # comment ✓
"""


@dataclass(slots=True)
class TinyModel:
    hf_dir: Path
    gguf_path: Path


@dataclass(frozen=True, slots=True)
class _TokSpec:
    specials: tuple[str, ...]
    specials_first: bool  # Gemma puts its specials at ids 0..n, Llama/Qwen after the BPE vocab
    bos: str | None
    eos: str
    pad: str | None
    add_bos: bool
    split: str | None  # None: GPT-2 style ByteLevel regex
    chat_template: str
    gen_eos: tuple[str, ...]


TOK_SPECS: dict[str, _TokSpec] = {
    "llama": _TokSpec(
        ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|start_header_id|>",
         "<|end_header_id|>", "<|eot_id|>"),
        False, "<|begin_of_text|>", "<|eot_id|>", None, True, LLAMA3_SPLIT, LLAMA3_TEMPLATE,
        ("<|end_of_text|>", "<|eot_id|>"),
    ),
    "qwen2": _TokSpec(
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        False, None, "<|im_end|>", "<|endoftext|>", False, QWEN2_SPLIT, CHATML_TEMPLATE,
        ("<|im_end|>", "<|endoftext|>"),
    ),
    "gemma3": _TokSpec(
        ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
        True, "<bos>", "<eos>", "<pad>", True, None, GEMMA3_TEMPLATE,
        ("<eos>", "<end_of_turn>"),
    ),
}
# harmony (gpt-oss): messages on channels; a template of the same shape as gpt-oss's, without its system preamble
TOK_SPECS["gpt_oss"] = _TokSpec(
    ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|call|>", "<|start|>", "<|end|>", "<|message|>",
     "<|channel|>", "<|constrain|>"),
    False, None, "<|return|>", "<|endoftext|>", False, LLAMA3_SPLIT,
    "{%- for m in messages %}{%- if m['role'] == 'assistant' %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + m['content'] + '<|end|>' }}"
    "{%- else %}{{- '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}",
    ("<|return|>", "<|call|>", "<|endoftext|>"),
)
TOK_SPECS["qwen3"] = TOK_SPECS["qwen3_moe"] = TOK_SPECS["qwen2_moe"] = TOK_SPECS["qwen2"]
TOK_SPECS["mixtral"] = TOK_SPECS["olmoe"] = TOK_SPECS["granitemoe"] = TOK_SPECS["mistral"] = TOK_SPECS["llama"]
TOK_SPECS["phi3"] = TOK_SPECS["qwen2"]  # the tokenizer is not what a phi3 test looks at
TOK_SPECS["gemma2"] = TOK_SPECS["gemma3"]
TOK_SPECS["granite"] = TOK_SPECS["smollm3"] = TOK_SPECS["olmo2"] = TOK_SPECS["olmo3"] = TOK_SPECS["exaone4"] = TOK_SPECS["seed_oss"] = TOK_SPECS["ernie4_5"] = TOK_SPECS["ernie4_5_moe"] = TOK_SPECS["arcee"] = TOK_SPECS["glm4_moe"] = TOK_SPECS["granitemoehybrid"] = TOK_SPECS["glm4"] = TOK_SPECS["cohere"] = TOK_SPECS["cohere2"] = TOK_SPECS["stablelm"] = TOK_SPECS["starcoder2"] = TOK_SPECS["llama"]

DEFAULT_TIED = {"llama": False, "qwen2": True, "qwen3": False, "gemma3": True, "phi3": False, "gemma2": True, "granite": True,
                "smollm3": True, "olmo2": False, "olmo3": False, "exaone4": False, "seed_oss": False, "ernie4_5": True, "ernie4_5_moe": True, "glm4": False, "arcee": False, "glm4_moe": False, "gpt_oss": False, "granitemoehybrid": True, "cohere": True,
                "cohere2": True, "stablelm": False, "starcoder2": True, "qwen3_moe": False, "mixtral": False,
                "olmoe": False, "qwen2_moe": False, "granitemoe": True, "mistral": False}
EXTRA_ARCHS = ("phi3", "gemma2", "granite", "smollm3", "olmo2", "olmo3", "exaone4", "seed_oss", "ernie4_5", "ernie4_5_moe", "glm4", "arcee", "glm4_moe", "gpt_oss", "granitemoehybrid", "cohere", "cohere2", "stablelm", "starcoder2",
               "qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "granitemoe", "mistral")  # built by their own tests only (every ARCHS entry runs through the whole suite)


def _pre_tokenizer(split: str | None) -> pre_tokenizers.PreTokenizer:
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])


def _post_processor(spec: _TokSpec, tok: Tokenizer) -> processors.PostProcessor:
    if not spec.add_bos:
        return processors.ByteLevel(trim_offsets=False)
    bos_id = tok.token_to_id(spec.bos)
    return processors.TemplateProcessing(
        single=f"{spec.bos}:0 $A:0", pair=f"{spec.bos}:0 $A:0 {spec.bos}:1 $B:1", special_tokens=[(spec.bos, bos_id)]
    )


@lru_cache(maxsize=None)
def _tokenizer_json(arch: str) -> str:
    # Training is deterministic; caching the JSON keeps repeated fixture builds fast.
    spec = TOK_SPECS[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer(spec.split)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE + (len(spec.specials) if spec.specials_first else 0),
        special_tokens=list(spec.specials) if spec.specials_first else [],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True) * 2, trainer=trainer)
    tok.add_special_tokens(list(spec.specials))
    tok.post_processor = _post_processor(spec, tok)
    return tok.to_str()


def build_tokenizer(arch: str) -> Tokenizer:
    """The arch's tiny byte-level BPE tokenizer (a `tokenizers.Tokenizer`)."""
    return Tokenizer.from_str(_tokenizer_json(arch))


def _save_tokenizer(arch: str, out_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    spec = TOK_SPECS[arch]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(arch), bos_token=spec.bos, eos_token=spec.eos, pad_token=spec.pad,
        unk_token="<unk>" if "<unk>" in spec.specials else None, model_max_length=512,
    )
    fast.save_pretrained(out_dir)
    _finish_tokenizer_config(out_dir, spec)


def _finish_tokenizer_config(out_dir: Path, spec: _TokSpec) -> None:
    # Hub repos keep chat_template and add_bos_token in tokenizer_config.json; readers look there first.
    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg.update(chat_template=spec.chat_template, add_bos_token=spec.add_bos, add_eos_token=False)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False), encoding="utf-8")
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)


def _token_ids(arch: str) -> dict[str, int | list[int] | None]:
    spec, tok = TOK_SPECS[arch], build_tokenizer(arch)
    tid = tok.token_to_id
    return {
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "bos_token_id": tid(spec.bos) if spec.bos else None,
        "eos_token_id": tid(spec.eos),
        "pad_token_id": tid(spec.pad) if spec.pad else None,
        "gen_eos": [tid(t) for t in spec.gen_eos],
    }


# Granite's scalars made large enough to matter in a tiny model (Granite 3 2B's: 12, 0.22, 0.015625, 8)
GRANITE_LAYOUT = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
                  "embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.4,
                  "logits_scaling": 2.5, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def _config(arch: str, tied: bool, overrides: dict | None = None):
    ids = _token_ids(arch)
    common = dict(
        vocab_size=ids["vocab_size"], hidden_size=64, intermediate_size=128, max_position_embeddings=512,
        bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"],
        tie_word_embeddings=tied, dtype="float32",
    ) | (overrides or {})
    if arch == "phi3":
        from transformers import Phi3Config

        # a window of 8 keys, as Phi-3-mini-4k's 2047, crossed by the tests' 21-token prompts
        return Phi3Config(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "rms_norm_eps": 1e-5, "sliding_window": 8, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                             "attention_dropout": 0.0, "rope_parameters": {"rope_type": "default",
                                                                          "rope_theta": 10000.0}} | common)
    if arch == "gemma2":
        return _gemma2_config(common)
    if arch == "olmo2":
        from transformers import Olmo2Config

        return Olmo2Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                           rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, **common)
    if arch == "olmo3":
        from transformers import Olmo3Config

        # 5 layers: the fourth full, the others sliding over 8 keys (crossed by the tests' prompts); YaRN (factor 4
        # over 64 original positions, as Olmo-3-7B's 8 over 8,192) on the full layer only
        rope = {"full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 64, "attention_factor": 1 + 0.1 * math.log(4.0)},
                "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}
        return Olmo3Config(**{"num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "rms_norm_eps": 1e-6, "sliding_window": 8, "rope_parameters": rope}
                           | common | (overrides or {}))
    if arch == "exaone4":
        from transformers import Exaone4Config

        # 5 layers: the fourth global without rotary positions, the others sliding over 8 keys (EXAONE 4.0 32B's
        # "LLLG" over 4,096) with Llama 3's scaling in all three bands (as the 32B's factor 16 over 8,192)
        rope = {"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return Exaone4Config(**{"num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "rms_norm_eps": 1e-5, "sliding_window": 8, "sliding_window_pattern": 4,
                                "rope_parameters": rope} | common | (overrides or {}))
    if arch == "seed_oss":
        from transformers import SeedOssConfig

        # q/k/v biases; heads wider than hidden / heads (Seed-OSS-36B: 128 against 5120 / 80)
        return SeedOssConfig(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "head_dim": 32, "rms_norm_eps": 1e-6, "attention_bias": True,
                                "attention_out_bias": False, "mlp_bias": False,
                                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0}}
                             | common | (overrides or {}))
    if arch == "ernie4_5":
        from transformers import Ernie4_5Config

        # rotary over adjacent pairs; heads wider than hidden / heads (ERNIE-4.5-0.3B: 128 against 1024 / 16), tied
        return Ernie4_5Config(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "head_dim": 32, "rms_norm_eps": 1e-5, "use_bias": False,
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
                              | common | (overrides or {}))
    if arch == "ernie4_5_moe":
        from transformers import Ernie4_5_MoeConfig

        # a dense first layer, then 8 experts of 2 per token chosen with the selection bias, and 2 shared ones
        # (ERNIE-4.5-21B-A3B: 64 of 6, 2 shared)
        return Ernie4_5_MoeConfig(**{"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                                     "head_dim": 16, "rms_norm_eps": 1e-5, "use_bias": False, "moe_num_experts": 8,
                                     "moe_k": 2, "moe_intermediate_size": 32, "moe_num_shared_experts": 2,
                                     "moe_layer_start_index": 1, "moe_layer_interval": 1,
                                     "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
                                  | common | (overrides or {}))
    if arch == "granitemoehybrid":
        from transformers import GraniteMoeHybridConfig

        # Granite 4.0 Micro's layout (every layer attention, the dense "shared" MLP, rotary positions) with Granite's
        # scalars as test_granite.py has them; experts and no rotary are config overrides
        return GraniteMoeHybridConfig(**{**GRANITE_LAYOUT, "num_local_experts": 0, "shared_intermediate_size": 128,
                                         "position_embedding_type": "rope", "layer_types": ["attention"] * 2,
                                         "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16}
                                      | common | (overrides or {}))
    if arch == "glm4_moe":
        from transformers import Glm4MoeConfig

        # a dense first layer, then 8 experts of 2 per token by sigmoid scores with the selection bias, scaled by 2.5
        # (GLM-4.5: 160 of 8, 2.5), one shared expert; half of each 32-dim head rotates; q/k/v biases and q/k norms
        return Glm4MoeConfig(**{"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "head_dim": 32, "rms_norm_eps": 1e-5, "attention_bias": True, "use_qk_norm": True,
                                "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                "n_shared_experts": 1, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
                                "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
                                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                    "partial_rotary_factor": 0.5}}
                             | common | (overrides or {}))
    if arch == "gpt_oss":
        from transformers import GptOssConfig

        # sliding layers over 8 keys around a full one (gpt-oss: 128), YaRN over 64 original positions untruncated (its
        # 32 over 4,096), 8 experts of 2 per token (gpt-oss-20b: 32 of 4), sinks and biases everywhere
        rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 64}
        return GptOssConfig(**{"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "head_dim": 16, "rms_norm_eps": 1e-5, "num_local_experts": 8,
                               "num_experts_per_tok": 2, "sliding_window": 8, "rope_parameters": rope}
                            | common | {"intermediate_size": 32} | (overrides or {}))
    if arch == "arcee":
        from transformers import ArceeConfig

        # the MLP without a gate, relu²
        return ArceeConfig(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "rms_norm_eps": 1e-5, "hidden_act": "relu2",
                              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
                           | common | (overrides or {}))
    if arch == "glm4":
        from transformers import Glm4Config

        # half of each 32-dim head rotates in adjacent pairs (GLM-4-9B: half of 128); q/k/v biases
        return Glm4Config(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "head_dim": 32, "rms_norm_eps": 1e-5, "attention_bias": True,
                             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.5}}
                          | common | (overrides or {}))
    if arch == "cohere":
        from transformers import CohereConfig

        # a logit scale and LayerNorm eps unlike the defaults, so that reading them matters
        return CohereConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, layer_norm_eps=1e-4,
                            logit_scale=0.25, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
    if arch == "stablelm":
        from transformers import StableLmConfig

        # StableLM 2 1.6B's choices: q/k/v biases, a quarter of each 16-dim head rotated, blocks in turn
        return StableLmConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, layer_norm_eps=1e-5,
                              use_qkv_bias=True, hidden_dropout=0.0, attention_dropout=0.0,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.25}, **common)
    if arch == "starcoder2":
        from transformers import Starcoder2Config

        # biases everywhere, a gelu MLP without a gate; no sliding window here (a GGUF file has none: its own test)
        return Starcoder2Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, norm_epsilon=1e-5,
                                use_bias=True, residual_dropout=0.0, embedding_dropout=0.0,
                                attention_dropout=0.0, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                                **({"sliding_window": None} | common))
    if arch == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        # 8 experts, 2 per token, every layer routed (as Qwen3-30B-A3B); dense layers are a config override
        return Qwen3MoeConfig(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "head_dim": 32, "rms_norm_eps": 1e-6, "num_experts": 8, "num_experts_per_tok": 2,
                                 "moe_intermediate_size": 32, "norm_topk_prob": True, "decoder_sparse_step": 1,
                                 "mlp_only_layers": [], "rope_parameters": {"rope_type": "default",
                                                                            "rope_theta": 1000000.0}} | common)
    if arch == "mixtral":
        from transformers import MixtralConfig

        # 4 experts of 2 per token (Mixtral: 8 of 2), no sliding window (Mixtral 8x7B's config has none)
        return MixtralConfig(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "rms_norm_eps": 1e-5, "num_local_experts": 4, "num_experts_per_tok": 2,
                                "sliding_window": None, "router_jitter_noise": 0.0,
                                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
                             | common | {"intermediate_size": 32} | (overrides or {}))
    if arch == "qwen2_moe":
        from transformers import Qwen2MoeConfig

        # 8 experts, 2 per token, unnormalised, and the shared expert (Qwen1.5-MoE-A2.7B: 60 of 4, shared 5632)
        return Qwen2MoeConfig(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "rms_norm_eps": 1e-6, "num_experts": 8, "num_experts_per_tok": 2,
                                 "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
                                 "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                                 "use_sliding_window": False, "qkv_bias": True,
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}} | common)
    if arch == "olmoe":
        from transformers import OlmoeConfig

        # 8 experts, 2 per token, their weights left unnormalised (OLMoE-1B-7B: 64 of 8); no GQA, as llama.cpp wants
        return OlmoeConfig(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                              "rms_norm_eps": 1e-5, "num_experts": 8, "num_experts_per_tok": 2,
                              "norm_topk_prob": False, "clip_qkv": None,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
                           | common | {"intermediate_size": 32} | (overrides or {}))
    if arch == "cohere2":
        from transformers import Cohere2Config

        # 5 layers: the fourth global and without rotary positions, the others sliding over 8 keys
        return Cohere2Config(num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, layer_norm_eps=1e-4,
                             logit_scale=0.25, sliding_window=8,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
    if arch == "smollm3":
        from transformers import SmolLM3Config

        # 5 layers: the fourth attends without rotary positions (no_rope_layer_interval 4)
        return SmolLM3Config(num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                             rope_parameters={"rope_type": "default", "rope_theta": 5000000.0}, **common)
    if arch == "mistral":
        from transformers import MistralConfig

        # heads wider than hidden / heads, as Mistral NeMo's 128 against 5120 / 32; a window of 8 keys (Mistral 7B
        # v0.1: 4096) crossed by the tests' 21-token prompts, unless overridden (a GGUF file has none)
        return MistralConfig(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "head_dim": 32, "rms_norm_eps": 1e-5, "sliding_window": 8,
                                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
                             | common | (overrides or {}))
    if arch == "granitemoe":
        from transformers import GraniteMoeConfig

        # Granite's scalars as its test has them; 8 experts of 2 per token (Granite 3 1B-A400M: 32 of 8)
        return GraniteMoeConfig(**{**GRANITE_LAYOUT, "num_local_experts": 8, "num_experts_per_tok": 2}
                                | common | {"intermediate_size": 32} | (overrides or {}))
    if arch == "granite":
        from transformers import GraniteConfig

        return GraniteConfig(**GRANITE_LAYOUT, **common)
    if arch == "llama":
        from transformers import LlamaConfig

        # original_max_position_embeddings=64 puts the head_dim-16 frequencies in all three llama3 bands.
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           rms_norm_eps=1e-5, rope_parameters=rope, **common)
    if arch == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)
    if arch == "qwen3":
        from transformers import Qwen3Config

        # head_dim * heads (128) != hidden (64), as in the real Qwen3 checkpoints.
        return Qwen3Config(**{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "head_dim": 32, "rms_norm_eps": 1e-6,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}} | common)
    return _gemma3_config(common)


def _gemma3_config(common: dict):
    from transformers import Gemma3TextConfig

    n_layers = 7  # 5 sliding, 1 global, then one more sliding layer
    layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layers)]
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}
    # query_pre_attn_scalar == head_dim as in every Gemma 3 but 27B: llama.cpp hard-codes 1/sqrt(head_dim).
    return Gemma3TextConfig(num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                            rms_norm_eps=1e-6, sliding_window=8, layer_types=layer_types, rope_parameters=rope,
                            query_pre_attn_scalar=32, hidden_activation="gelu_pytorch_tanh", **common)


def _gemma2_config(common: dict):
    from transformers import Gemma2Config

    # caps low enough that the tiny model's scores and logits reach them (the real ones: 50 and 30); layers alternate
    # sliding (window 8, crossed by the tests' prompts) and global
    return Gemma2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                        rms_norm_eps=1e-6, sliding_window=8, query_pre_attn_scalar=32, attn_logit_softcapping=1.5,
                        final_logit_softcapping=4.0, hidden_activation="gelu_pytorch_tanh",
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)


def _model_class(arch: str):
    import transformers

    name = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "gemma3": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
            "granite": "GraniteForCausalLM", "smollm3": "SmolLM3ForCausalLM",
            "olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM", "exaone4": "Exaone4ForCausalLM",
            "seed_oss": "SeedOssForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM",
            "ernie4_5_moe": "Ernie4_5_MoeForCausalLM", "glm4": "Glm4ForCausalLM",
            "arcee": "ArceeForCausalLM", "glm4_moe": "Glm4MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
            "granitemoehybrid": "GraniteMoeHybridForCausalLM",
            "cohere": "CohereForCausalLM",
            "cohere2": "Cohere2ForCausalLM", "stablelm": "StableLmForCausalLM",
            "starcoder2": "Starcoder2ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM",
            "qwen2_moe": "Qwen2MoeForCausalLM", "granitemoe": "GraniteMoeForCausalLM",
            "mistral": "MistralForCausalLM"}[arch]
    return getattr(transformers, name)


@torch.no_grad()
def _randomize(model: torch.nn.Module, arch: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            # Gemma scales by (1 + w), the others by w: both get a visibly non-trivial scale.
            p.copy_(0.3 * noise if arch.startswith("gemma") else 1.0 + 0.3 * noise)
        elif name.endswith(".bias"):
            p.copy_(0.2 * noise)
        elif arch == "gpt_oss" and name.endswith("experts.gate_up_proj"):  # wide enough that its clamps at ±7 bite
            p.copy_(6.0 * noise / p.shape[1] ** 0.5)
        elif name.endswith(("mlp.gate.weight", "shared_expert_gate.weight", "block_sparse_moe.router.weight",
                            "mlp.router.weight")):  # a router: wide margins, so that quantized weights pick the same experts
            p.copy_(6.0 * noise / p.shape[-1] ** 0.5)
        elif name.endswith("embed_tokens.weight"):
            p.copy_((0.125 if arch.startswith("gemma") else 0.5) * noise)  # Gemma multiplies embeddings by sqrt(hidden)
        else:
            p.copy_(noise / p.shape[-1] ** 0.5)


def make_tiny_hf(arch: str, out_dir: Path, seed: int = 0, tie_embeddings: bool | None = None,
                 config: dict | None = None) -> Path:
    """Build a tiny random model of `arch` and save it (safetensors, config, tokenizer) to `out_dir`; `config`
    overrides the arch's tiny settings."""
    if arch not in ARCHS + EXTRA_ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS + EXTRA_ARCHS}")
    out_dir = Path(out_dir)
    tied = DEFAULT_TIED[arch] if tie_embeddings is None else tie_embeddings
    config = _config(arch, tied, config)
    model = _model_class(arch)(config).to(torch.float32).eval()
    _randomize(model, arch, seed)
    _set_generation_config(model, arch)
    model.save_pretrained(out_dir, safe_serialization=True)
    _save_tokenizer(arch, out_dir)
    return out_dir


def _set_generation_config(model: torch.nn.Module, arch: str) -> None:
    ids = _token_ids(arch)
    gen = model.generation_config
    gen.bos_token_id, gen.pad_token_id = ids["bos_token_id"], ids["pad_token_id"]
    gen.eos_token_id = ids["gen_eos"]


def load_hf_reference(hf_dir: Path):
    """The saved model reloaded with transformers, float32, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(Path(hf_dir), dtype=torch.float32)
    return model.eval()
