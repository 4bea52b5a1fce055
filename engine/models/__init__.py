"""One file per architecture on one template; `architecture(name)` picks the file by model type."""
from __future__ import annotations

import importlib
from types import ModuleType

from engine.errors import UnsupportedModelError

# model type (a HF config's model_type, a GGUF file's general.architecture) -> the module of engine/models that runs it
MODULES = {
    "arcee": "arcee", "cohere": "cohere", "command-r": "cohere", "cohere2": "cohere2", "ernie4_5": "ernie4_5",
    "ernie4_5_moe": "ernie4_5_moe", "ernie4_5-moe": "ernie4_5_moe", "exaone": "exaone", "exaone4": "exaone4",
    "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "glm4": "glm4", "glm4_moe": "glm4_moe",
    "glm4moe": "glm4_moe", "gpt_oss": "gpt_oss", "gpt-oss": "gpt_oss", "granite": "granite", "granitemoe": "granitemoe", "granitemoehybrid": "granitemoehybrid",
    "granitehybrid": "granitemoehybrid", "llama": "llama", "mistral": "mistral",
    "mixtral": "mixtral", "olmo2": "olmo2", "olmo3": "olmo3", "olmoe": "olmoe", "phi3": "phi3", "qwen2": "qwen2",
    "qwen2_moe": "qwen2_moe", "qwen2moe": "qwen2_moe", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe",
    "qwen3moe": "qwen3_moe", "seed_oss": "seed_oss", "smollm3": "smollm3", "stablelm": "stablelm",
    "starcoder2": "starcoder2",
}
SUPPORTED = tuple(MODULES)
# how refusals name them: the model types a user meets, with the models they are
NAMED = {
    "arcee": "AFM-4.5B", "cohere": "Command-R, Aya", "cohere2": "Command-R7B", "ernie4_5": "ERNIE 4.5 dense",
    "ernie4_5_moe": "ERNIE 4.5 21B-A3B", "exaone": "EXAONE 3.x", "exaone4": "EXAONE 4.0", "gemma2": "", "gemma3": "",
    "glm4": "GLM-4-0414", "glm4_moe": "GLM-4.5, GLM-4.5-Air", "gpt_oss": "gpt-oss-20b, gpt-oss-120b", "granite": "", "granitemoe": "Granite 3 MoE",
    "granitemoehybrid": "Granite 4.0 without Mamba layers",
    "llama": "", "mistral": "", "mixtral": "", "olmo2": "", "olmo3": "", "olmoe": "", "phi3": "Phi-3, Phi-4",
    "qwen2": "", "qwen2_moe": "", "qwen3": "", "qwen3_moe": "Qwen3-30B-A3B", "seed_oss": "Seed-OSS-36B", "smollm3": "",
    "stablelm": "StableLM 2", "starcoder2": "",
}
RUNS = "Parley runs: " + ", ".join(f"{t} ({m})" if m else t for t, m in NAMED.items()) + "."


def architecture(model_type: str) -> ModuleType:
    """The module implementing `model_type` (ModelArgs parsing, Model, sanitize, GGUF names)."""
    if model_type not in MODULES:
        raise UnsupportedModelError(f"Architecture {model_type!r} is not supported. {RUNS}")
    return importlib.import_module(f"engine.models.{MODULES[model_type]}")
