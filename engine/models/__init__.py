"""One file per architecture on one template; `architecture(name)` picks the file by model type."""
from __future__ import annotations

from types import ModuleType

from engine.errors import UnsupportedModelError

SUPPORTED = ("cohere", "cohere2", "command-r", "exaone", "gemma2", "gemma3", "gemma3_text", "granite", "granitemoe",
             "llama", "mistral", "mixtral", "olmo2", "olmoe", "phi3", "qwen2", "qwen2_moe", "qwen2moe", "qwen3",
             "qwen3_moe", "qwen3moe", "smollm3", "stablelm", "starcoder2")
# how refusals name them
RUNS = (
    "Parley runs: cohere (Command-R, Aya), cohere2 (Command-R7B), exaone (EXAONE 3.x), gemma2, gemma3, granite, "
    "granitemoe (Granite 3 MoE), llama, mistral, mixtral, olmo2, olmoe, phi3 (Phi-3, Phi-4), qwen2, qwen2_moe, qwen3, "
    "qwen3_moe (Qwen3-30B-A3B), smollm3, stablelm (StableLM 2), starcoder2."
)


def architecture(model_type: str) -> ModuleType:
    """The module implementing `model_type` (ModelArgs parsing, Model, sanitize, GGUF names)."""
    from engine.models import (
        cohere, cohere2, exaone, gemma2, gemma3, granite, granitemoe, llama, mistral, mixtral, olmo2, olmoe, phi3,
        qwen2, qwen2_moe, qwen3, qwen3_moe, smollm3, stablelm, starcoder2,
    )

    table = {"cohere": cohere, "cohere2": cohere2, "command-r": cohere, "exaone": exaone, "gemma2": gemma2,
             "gemma3": gemma3, "gemma3_text": gemma3, "granite": granite, "granitemoe": granitemoe,
             "llama": llama, "mistral": mistral, "mixtral": mixtral,
             "olmo2": olmo2, "olmoe": olmoe, "phi3": phi3, "qwen2": qwen2, "qwen2_moe": qwen2_moe,
             "qwen2moe": qwen2_moe, "qwen3": qwen3, "qwen3_moe": qwen3_moe,
             "qwen3moe": qwen3_moe, "smollm3": smollm3, "stablelm": stablelm, "starcoder2": starcoder2}
    if model_type not in table:
        raise UnsupportedModelError(
            f"Architecture {model_type!r} is not supported. {RUNS}"
        )
    return table[model_type]
