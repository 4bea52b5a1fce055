"""Session fixtures for the embedded Gemma 3 270M: our loaded model and transformers' (the oracle)."""
from __future__ import annotations

from pathlib import Path

import pytest

LONG_TEXT = " ".join(
    f"Entry {i}: the {animal} from {city} walked {n} miles to trade {good} at the market near the {place}."
    for i, (animal, city, n, good, place) in enumerate(
        [
            (a, c, 3 + 7 * k, g, p)
            for k, (a, c, g, p) in enumerate(
                zip(
                    ["fox", "heron", "goat", "otter", "lynx", "crane", "badger", "moose", "ibis", "yak"] * 4,
                    ["Lyon", "Quito", "Oslo", "Pune", "Hanoi", "Cusco", "Perth", "Tunis", "Riga", "Accra"] * 4,
                    ["salt", "wool", "tea", "copper", "figs", "amber", "rice", "silk", "honey", "flint"] * 4,
                    ["river", "castle", "harbor", "temple", "bridge", "forest", "mill", "canyon", "lake", "tower"] * 4,
                )
            )
        ]
    )
)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "Water boils at 100 degrees Celsius. At sea level, water freezes at",
    "東京は日本の首都です。大阪は",
    LONG_TEXT + " Entry 40: the",  # over 600 tokens: past the 512-token sliding window
]


@pytest.fixture(scope="session")
def gemma_lm(gemma_gguf_path: Path):
    """The embedded GGUF through our loader, dequantized (fp32, CPU): the path that matches transformers."""
    from engine.loading.loader import LoadOptions, load_model

    return load_model(gemma_gguf_path, LoadOptions(weights="dequantized"))


@pytest.fixture(scope="session")
def gemma_lm_quantized(gemma_gguf_path: Path):
    """The embedded GGUF with its matrices kept quantized (the default on CPU)."""
    from engine.loading.loader import LoadOptions, load_model

    return load_model(gemma_gguf_path, LoadOptions(weights="quantized"))


@pytest.fixture(scope="session")
def hf_gemma(gemma_gguf_path: Path):
    """transformers' own loading of the same GGUF (~30 s, 3.4 GB): a reference no one here wrote."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gemma_gguf_path.parent), gguf_file=gemma_gguf_path.name, dtype="float32"
    )
    return model.eval()
