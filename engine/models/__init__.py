"""One file per architecture on one template; `architecture(name)` picks the file by model type."""
from __future__ import annotations

from types import ModuleType

from engine.errors import UnsupportedModelError

SUPPORTED = ("gemma3", "gemma3_text", "llama", "qwen2", "qwen3")


def architecture(model_type: str) -> ModuleType:
    """The module implementing `model_type` (ModelArgs parsing, Model, sanitize, GGUF names)."""
    from engine.models import gemma3, llama, qwen2, qwen3

    table = {"gemma3": gemma3, "gemma3_text": gemma3, "llama": llama, "qwen2": qwen2, "qwen3": qwen3}
    if model_type not in table:
        raise UnsupportedModelError(
            f"Architecture {model_type!r} is not supported. Parley runs: gemma3, llama, qwen2, qwen3."
        )
    return table[model_type]
