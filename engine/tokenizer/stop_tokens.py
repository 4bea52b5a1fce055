"""Which ids end an answer: end-of-sequence plus the end-of-turn tokens of known chat formats."""
from __future__ import annotations

from collections.abc import Callable, Iterable

# Gemma, Llama 3 (end of turn, end of message), ChatML/Qwen, GPT-style, Phi-3, harmony (gpt-oss: the answer's end, a
# tool call), Command-R, EXAONE, Granite and Llama 3's end of text (files that name another eos still end there)
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>", "<|end|>",
                      "<|return|>", "<|call|>", "<|END_OF_TURN_TOKEN|>", "[|endofturn|]", "<|end_of_text|>")
# where a code model's filled-in middle ends (llama.cpp ends generation there too): CodeLlama's end of the middle,
# CodeGemma's file separator, Qwen2.5-Coder's padding, repository and file markers
END_OF_MIDDLE_TOKENS = ("\u2581<EOT>", "<EOT>", "<|file_separator|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


def collect_stop_ids(token_to_id: Callable[[str], int | None], eos_id: int | None, extra_ids: Iterable[int],
                     vocab_size: int) -> frozenset[int]:
    """eos, any known end-of-turn token the vocabulary has, and ids the model files name."""
    ids = {eos_id} if eos_id is not None else set()
    ids.update(i for i in map(token_to_id, END_OF_TURN_TOKENS + END_OF_MIDDLE_TOKENS) if i is not None)
    ids.update(extra_ids)
    if all(token_to_id(t) is not None for t in ("<|return|>", "<|call|>")):
        ids.discard(token_to_id("<|end|>"))  # harmony: <|end|> closes one message (the thought), not the answer
    return frozenset(i for i in ids if 0 <= i < vocab_size)
