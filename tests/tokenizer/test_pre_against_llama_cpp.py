"""Each `tokenizer.ggml.pre` family Parley knows cuts text as llama.cpp's own tokenizer does: the same GGUF vocabulary
under each name, token ids compared on text that tells the regexes apart (case runs, contractions, digit runs,
slashes, newlines, CJK)."""
from __future__ import annotations

import pytest

from engine.tokenizer.from_gguf import tokenizer_from_gguf
from engine.loading.gguf_file import open_gguf

pytestmark = pytest.mark.slow  # needs transformers (the tiny model's vocabulary)

TEXTS = [
    "I'm  fine!!\n\nOK 12345 and 1234567",
    "HELLOworld don'T CamelCaseWords WE'LL see",
    "path/to/file.py a//b x=/usr/lib/ ok/\n\n\tdef f():\n        return 42",
    "naïve café ﬁnal Ünïcödé",
    "日本語のテキストと English 混在 123",
    "emoji 🙂🙂 and\r\nwindows\r\nlines   trailing   ",
    "def f(x):\n\treturn x**2  # square!\nHello, World! (test) [a] {b} <c> 'q' \"d\" a+b=c; x->y",
    "ひらがなカタカナ漢字テスト、句読点。Ａｂｃ１２３",  # kana runs (DeepSeek-V3), full-width letters and digits
    "x{y}z [1,2,3] 'abc' #tag @user $5.00 50% a_b",  # a symbol leading a word (DeepSeek-V3)
    "The QUICK brown fox's 2024-12-03 résumé naïveté",
]
# Combining marks inside words (Thai, Devanagari): Qwen 3.5 keeps them in the word. Compared for the families whose
# llama.cpp split reads \p{M} as its tokenizer.json does (its o200k and tekken rewrites leave marks out of words).
MARK_TEXTS = ["สวัสดีครับ ผมชื่ออเล็กซ์ नमस्ते दुनिया", "ภาษาไทย हिन्दी भाषा के शब्द"]
PRES = ["gpt-2", "llama-bpe", "falcon3", "pixtral", "tekken", "qwen2", "deepseek-r1-qwen", "stablelm2", "dbrx", "smollm",
        "gpt-4o", "llama4", "starcoder", "refact", "command-r", "exaone", "deepseek-coder", "deepseek-v3", "seed-coder",
        "minerva-7b", "deepseek-llm", "viking", "glm4", "chatglm-bpe"]


@pytest.fixture(scope="module")
def vocab_gguf(tmp_path_factory):
    """A vocabulary whose merges cross every regex's piece boundaries (trained on whole lines), in a GGUF of the tiny
    qwen2's header and no tensors: wherever two regexes cut a text apart, their token ids differ."""
    import gguf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.support.gemma import SPECIAL_CHATML, byte_level_metadata
    from tests.support.gguf_export import copy_fields, write_gguf
    from tests.support.tiny_models import make_tiny_hf

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, special_tokens=SPECIAL_CHATML,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator((TEXTS + MARK_TEXTS) * 20, trainer)
    root = tmp_path_factory.mktemp("pre")
    header = gguf.GGUFReader(write_gguf(make_tiny_hf("qwen2", root / "hf"), root / "tiny.gguf", "F32"))
    writer = gguf.GGUFWriter(root / "vocab.gguf", "qwen2")
    copy_fields(header, writer, lambda key: key.startswith("tokenizer."))
    meta = byte_level_metadata(backend, "gpt-2")
    writer.add_tokenizer_model(meta["tokenizer.ggml.model"])
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_token_merges(meta["tokenizer.ggml.merges"])
    writer.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    writer.add_add_bos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return root / "vocab.gguf"


@pytest.mark.parametrize("pre, texts", [pytest.param(pre, TEXTS, id=pre) for pre in PRES]
                         + [pytest.param(pre, MARK_TEXTS, id=f"{pre}-marks")
                            for pre in ("qwen35", "qwen2", "llama-bpe", "glm4", "gpt-2")])
def test_token_ids_equal_llama_cpp(vocab_gguf, tmp_path, pre, texts):
    llama_cpp = pytest.importorskip("llama_cpp")
    import gguf

    from tests.support.gguf_export import rewrite_gguf

    path = rewrite_gguf(gguf.GGUFReader(vocab_gguf), tmp_path / f"{pre}.gguf", extra={"tokenizer.ggml.pre": pre})
    ours = tokenizer_from_gguf(open_gguf(path).metadata)
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in texts:
        assert ours.encode(text, add_bos=False) == ref.tokenize(text.encode(), add_bos=False, special=False), \
            (pre, text)


SPM_TEXTS = ["Hello world", "<s>Hello", "a</s>b", "</s>", "<s>[INST] Hi there[/INST] Fine.</s>[INST] And you?[/INST]",
             "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", " leading", "two  spaces\n\nlines",
             "</s> after", "x<start_of_turn>y", "日本語 and émoji 🙂"]


@pytest.mark.parametrize("space_prefix", [True, False])
def test_sentencepiece_vocab_against_llama_cpp(tmp_path, space_prefix: bool) -> None:
    """A `llama` (SentencePiece) vocabulary with and without the dummy prefix: the space goes before the text and after
    each special or user-defined token, never before a bos the text starts with (Llama 2, Mistral's GGUFs)."""
    import gguf
    llama_cpp = pytest.importorskip("llama_cpp")

    from tests.support.gemma import sentencepiece_metadata, train_sentencepiece

    meta = sentencepiece_metadata(train_sentencepiece(add_dummy_prefix=space_prefix), space_prefix)
    path = tmp_path / "spm.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(8)
    writer.add_head_count(1)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_scores(meta["tokenizer.ggml.scores"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reference = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tok = tokenizer_from_gguf(open_gguf(path).metadata)
    for text in SPM_TEXTS:
        for bos in (False, True):
            assert tok.encode(text, add_bos=bos) == reference.tokenize(text.encode(), add_bos=bos, special=True), \
                (text, bos)
