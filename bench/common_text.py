"""Long, varied prompt text for benchmarks."""
from __future__ import annotations

TOPICS = ["rivers", "bridges", "comets", "violins", "glaciers", "printing", "bees", "lighthouses", "maps", "clocks"]


def long_prompt(tok, n_tokens: int) -> list[int]:
    """At least n_tokens of varied English prose (BOS first), cut to exactly n_tokens."""
    parts, i = [], 0
    while True:
        topic = TOPICS[i % len(TOPICS)]
        parts.append(f"Section {i}. A short note on {topic}: people have studied {topic} for {i + 3} centuries, "
                     f"and each generation adds {i % 7 + 2} new questions about how {topic} shape daily life.")
        ids = tok.encode(" ".join(parts), add_bos=True)
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
        i += 1


# eight different openings: the sessions of the batched benchmarks
PROMPTS = [
    "The history of the printing press begins",
    "def quicksort(xs):",
    "In the morning the harbor was quiet and",
    "Photosynthesis is the process by which",
    "The three laws of motion state that",
    "Once upon a time there lived a",
    "SELECT name, email FROM users WHERE",
    "The recipe calls for two cups of flour,",
]
