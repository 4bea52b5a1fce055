"""Whether a model's chat template reads the Thinking setting, known from its file's header (a GGUF's scalars, a
Hugging Face folder's tokenizer files) before the model loads: the app greys the setting for a template without a
switch from the start, not only once the model has loaded (its load says the same: Tokenizer.thinking_switch)."""
from __future__ import annotations

import json
from pathlib import Path

from engine.errors import ParleyError
from engine.tokenizer.chat_template import ChatTemplate
from engine.tokenizer.harmony import CHANNEL
from engine.tokenizer.tokenizer import reads_thinking

MAX_JSON_BYTES = 16 << 20  # a tokenizer_config.json with its template is some KB; a huge one is not read


def template_thinking_switch(source: Path, cache_dir: Path | None = None) -> bool | None:
    """True or False for a model file or folder whose chat template can be read; None where it cannot (missing,
    damaged, remote), which the load then tells. `cache_dir`: the loads' cache, whose saved vocabulary spares reading
    the file's (the embedded Gemma's 262,144 token strings: 0.2-0.45 s of Python, ~0.01 s without)."""
    from engine.loading.gguf_split import model_file

    try:
        path = model_file(Path(source))
        template = _gguf_template(path, cache_dir) if path.is_file() else _folder_template(path)
    except (ParleyError, OSError, ValueError, UnicodeDecodeError):
        return None
    if template is None:
        return None
    return reads_thinking(ChatTemplate(template), harmony=CHANNEL in template)  # gpt-oss: its template's own tags


def _gguf_template(path: Path, cache_dir: Path | None) -> str:
    from engine.loading.gguf_header import scan_header
    from engine.loading.tokenizer_cache import vocabulary_spans
    from engine.tokenizer.from_gguf import gguf_template_source

    return gguf_template_source(scan_header(path, vocabulary_spans(cache_dir, path)).scalars)


def _folder_template(path: Path) -> str | None:
    from engine.tokenizer.hf_files import folder_template_source

    config = path / "tokenizer_config.json"
    if not (path / "config.json").is_file():
        return None
    if config.is_file() and config.stat().st_size > MAX_JSON_BYTES:
        return None
    data = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    return folder_template_source(path, data if isinstance(data, dict) else {})
