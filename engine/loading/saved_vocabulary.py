"""A byte-level BPE (`gpt2`) vocabulary's arrays saved beside its tokenizer cache entry, in a form read in a few calls:
its BPE is built at every load (a saved `tokenizers` file reads slower than it builds, holding the interpreter
throughout), and walking 151,300 token strings and 151,000 merges in the GGUF header was 0.27-0.39 s of Python beside
the app's window."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import TokenizerError

FILE = "vocabulary.json"
# a noncharacter no real vocabulary holds (one that does is not saved), written as is: a control character such as NUL
# is escaped in JSON, and unescaping 300,000 of them doubled the read
SEPARATOR = "\uffff"
CHUNK = 8192  # strings split in one call: each call holds the interpreter (~50 ms for 151,300 in one)
STRINGS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
NUMBERS = ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def save_vocabulary(directory: Path, metadata: dict[str, Any]) -> bool:
    """Writes the vocabulary's arrays into `directory`; False, and nothing written, where a string holds SEPARATOR."""
    data: dict[str, Any] = {key: metadata[key] for key in NUMBERS if key in metadata}
    for key in (k for k in STRINGS if k in metadata):
        items = metadata[key]
        chunks = [SEPARATOR.join(items[i:i + CHUNK]) for i in range(0, len(items), CHUNK)]
        if sum(c.count(SEPARATOR) for c in chunks) != len(items) - len(chunks):
            return False
        data[key] = [len(items), chunks]
    (Path(directory) / FILE).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return True


def load_vocabulary(directory: Path) -> dict[str, list] | None:
    """The arrays `save_vocabulary` wrote; None where it wrote none; TokenizerError where they do not read."""
    file = Path(directory) / FILE
    if not file.exists():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        out = {key: list(data[key]) for key in NUMBERS if key in data}
        for key in (k for k in STRINGS if k in data):
            count, chunks = data[key]
            out[key] = []
            for chunk in chunks:
                out[key] += chunk.split(SEPARATOR)
            if len(out[key]) != count:
                raise ValueError(f"{key} holds {len(out[key])} items, not {count}")
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise TokenizerError(f"The saved vocabulary in {directory} does not read: {exc}") from exc
    return out
