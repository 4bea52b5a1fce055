"""GGUF `gpt2` vocabularies (byte-level BPE with merges), pre-tokenised by `tokenizer.ggml.pre`."""
from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, Tokenizer as Backend, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from engine.errors import TokenizerError
from engine.tokenizer.gguf_vocab import GGUFVocab

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Llama 3 and Qwen 2 differ only in how many digits one piece may hold.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
# Qwen 3.5: combining marks (Thai, Devanagari vowel signs) stay in their word, never start a symbol run
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k (GPT-4o, Phi-4-mini, Llama 4): a word's case run and its contraction stay one piece, "/" joins a symbol run
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O_SPLIT = "|".join([
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
# Mistral's tekken (Nemo, Small 3, Pixtral's text): o200k's case runs without the contractions, one digit a piece
TEKKEN_SPLIT = "|".join([
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*",
    r"\p{N}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
# DeepSeek-V3 / R1 (and R1-0528's Qwen3 distill): after digit runs and kana/CJK runs, a symbol may lead a Latin word
DEEPSEEK3_SPLIT = "|".join([
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+",
    r"[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+",
    r" ?[\p{P}\p{S}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
# Seed-Coder: Llama 3's split with one digit a piece and no newline run after a symbol run
SEED_CODER_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# DeepSeek-LLM (v1): newlines, then runs of Latin (and other cased scripts') letters, of ASCII and full-width symbols,
# trailing spaces, CJK and Hangul runs, digit runs; each split over the pieces of the one before (llama.cpp's order)
DEEPSEEK_LLM_SPLITS = (
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+",
    r"\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
)


@dataclass(slots=True)
class PreTokenizerStyle:
    """How one `tokenizer.ggml.pre` family cuts text before byte-level BPE."""

    split: str
    then: tuple[str, ...] = ()  # more splits, each over the pieces of the one before (DeepSeek-Coder's sequence)
    single_digits: bool = False
    nfc: bool = False
    ignore_merges: bool = False  # a whole piece found in the vocab is taken as is (tiktoken vocabularies)


def pre_tokenizer_style(pre: str) -> PreTokenizerStyle:
    """The style for a `tokenizer.ggml.pre` name; unknown names get GPT-2's."""
    if pre in ("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"):
        return PreTokenizerStyle(LLAMA3_SPLIT, ignore_merges=True)
    if pre == "deepseek-coder":  # newlines, then letter runs, punctuation runs, CJK runs, digits one by one
        return PreTokenizerStyle(r"[\r\n]", then=(r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"))
    if pre == "tekken":
        return PreTokenizerStyle(TEKKEN_SPLIT, ignore_merges=True)
    if pre == "deepseek-llm":
        return PreTokenizerStyle(DEEPSEEK_LLM_SPLITS[0], then=DEEPSEEK_LLM_SPLITS[1:])
    if pre == "viking":  # anything but spaces and sentence punctuation, then digits one by one
        return PreTokenizerStyle(" ?[^(\\s|.,!?…。，、।۔،)]+", then=(r"\p{N}",))
    if pre == "deepseek-v3":  # digit runs of up to 3, then kana and CJK runs, then the rest
        return PreTokenizerStyle(r"\p{N}{1,3}", then=("[一-龥\u3040-ゟ゠-ヿ]+", DEEPSEEK3_SPLIT))
    if pre == "seed-coder":
        return PreTokenizerStyle(SEED_CODER_SPLIT)
    if pre in ("dbrx", "smaug-bpe", "chatglm-bpe", "glm4"):  # cl100k-style (and GLM-4's): Llama 3's split, merges as usual
        return PreTokenizerStyle(LLAMA3_SPLIT)
    if pre in ("gpt-4o", "llama4"):
        return PreTokenizerStyle(GPT4O_SPLIT)
    if pre == "qwen35":
        return PreTokenizerStyle(QWEN35_SPLIT, nfc=True)
    if pre in ("qwen2", "qwen3", "deepseek-r1-qwen", "megrez", "stablelm2"):  # the R1 distills of Qwen 2.5
        return PreTokenizerStyle(QWEN2_SPLIT, nfc=True)
    if pre in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"):  # Granite 3: refact
        return PreTokenizerStyle(GPT2_SPLIT, single_digits=True)
    return PreTokenizerStyle(GPT2_SPLIT)


def build_byte_level_bpe(vocab: GGUFVocab) -> Backend:
    """A byte-level BPE from the stored vocabulary and merges."""
    if not vocab.merges:
        raise TokenizerError("The model's byte-level BPE tokenizer has no merges (tokenizer.ggml.merges is missing).")
    style = pre_tokenizer_style(vocab.pre)
    ids: dict[str, int] = {}
    for i, token in enumerate(vocab.tokens):
        ids.setdefault(token, i)
    try:
        model = BPE(vocab=ids, merges=_split_merges(vocab.merges), ignore_merges=style.ignore_merges)
    except Exception as exc:  # tokenizers raises a bare Exception: a merge of pieces the vocabulary lacks
        raise TokenizerError(f"The model's byte-level BPE tokenizer cannot be built: {exc}.") from None
    backend = Backend(model)
    if style.nfc:
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = _pre_tokenizer(style)
    backend.decoder = decoders.ByteLevel()
    added = vocab.added_tokens()
    backend.add_special_tokens([t for t in added if t.special])
    backend.add_tokens([t for t in added if not t.special])
    return backend


def _split_merges(merges: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise TokenizerError(f"Malformed tokenizer merge {merge!r} (expected two pieces separated by a space).")
        pairs.append((left, right))
    return pairs


def _pre_tokenizer(style: PreTokenizerStyle) -> pre_tokenizers.PreTokenizer:
    steps = [pre_tokenizers.Digits(individual_digits=True)] if style.single_digits else []
    steps += [pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False)
              for split in (style.split, *style.then)]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)
