"""Text at the engine's edge: tokenizers from GGUF or Hugging Face files, chat templates, streaming text."""
from engine.tokenizer.chat_template import ChatTemplate, gemma_chat_template, plain_chat_template
from engine.tokenizer.detokenizer import IncrementalDetokenizer
from engine.tokenizer.from_gguf import tokenizer_from_gguf
from engine.tokenizer.hf_files import tokenizer_from_hf_dir
from engine.tokenizer.tokenizer import Tokenizer, TokenizerInfo

__all__ = [
    "ChatTemplate",
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerInfo",
    "gemma_chat_template",
    "plain_chat_template",
    "tokenizer_from_gguf",
    "tokenizer_from_hf_dir",
]
