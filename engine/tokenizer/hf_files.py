"""Building a Tokenizer from a Hugging Face model folder (tokenizer.json and its companions)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend

from engine.errors import TokenizerError
from engine.tokenizer.chat_template import PLAIN_TEMPLATE
from engine.tokenizer.hf_backend import HFBackend
from engine.tokenizer.stop_tokens import collect_stop_ids
from engine.tokenizer.tokenizer import Tokenizer, TokenizerInfo


def tokenizer_from_hf_dir(path: Path) -> Tokenizer:
    """Reads tokenizer.json with tokenizer_config.json, and when present special_tokens_map.json,
    generation_config.json, config.json (embedding size) and chat_template.jinja."""
    path = Path(path)
    backend = _load_backend(path)
    config = _read_json(path / "tokenizer_config.json")
    special_map = _read_json(path / "special_tokens_map.json")
    generation = _read_json(path / "generation_config.json")
    bos_token = _token_content(config.get("bos_token", special_map.get("bos_token")))
    eos_token = _token_content(config.get("eos_token", special_map.get("eos_token")))
    bos_id = _id_of(backend, bos_token, generation.get("bos_token_id"))
    eos_ids = _as_list(generation.get("eos_token_id"))
    eos_id = _id_of(backend, eos_token, eos_ids[0] if eos_ids else None)
    vocab_size = _vocab_size(backend, _read_json(path / "config.json"))
    info = TokenizerInfo(
        vocab_size=vocab_size,
        bos_id=bos_id,
        eos_id=eos_id,
        add_bos=_adds_bos(backend, config, bos_id),
        stop_ids=collect_stop_ids(backend.token_to_id, eos_id, eos_ids, vocab_size),
        chat_template=folder_template_source(path, config),
        bos_token=bos_token or "",
        eos_token=eos_token or "",
    )
    return Tokenizer(HFBackend(backend), info)


def _load_backend(path: Path) -> Backend:
    file = path / "tokenizer.json"
    if not file.is_file():
        hint = " (only a slow tokenizer.model is there)" if (path / "tokenizer.model").exists() else ""
        raise TokenizerError(f"{path} has no tokenizer.json{hint}; Parley needs the fast tokenizer file.")
    try:
        return Backend.from_file(str(file))
    except Exception as exc:
        raise TokenizerError(f"{file} cannot be read as a tokenizer: {exc}") from exc


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{file.name} is not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens either as strings or as AddedToken dicts.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _id_of(backend: Backend, token: str | None, fallback: Any) -> int | None:
    token_id = backend.token_to_id(token) if token else None
    if token_id is None and fallback is not None:
        token_id = int(fallback)
    return token_id


def _adds_bos(backend: Backend, config: dict[str, Any], bos_id: int | None) -> bool:
    if bos_id is None:
        return False
    if "add_bos_token" in config:
        return bool(config["add_bos_token"])
    # Newer folders say it only through the post-processor: see whether it puts bos in front.
    return backend.encode("a", add_special_tokens=True).ids[:1] == [bos_id]


def _vocab_size(backend: Backend, model_config: dict[str, Any]) -> int:
    # The embedding is often padded past the tokenizer (e.g. Qwen), and that is what ids index.
    sizes = [backend.get_vocab_size(with_added_tokens=True)]
    sizes += [t.content and i + 1 for i, t in backend.get_added_tokens_decoder().items()]
    text_config = model_config.get("text_config") if isinstance(model_config.get("text_config"), dict) else {}
    for config in (model_config, text_config):
        if isinstance(config.get("vocab_size"), int):
            sizes.append(config["vocab_size"])
    return max(sizes)


def folder_template_source(path: Path, config: dict[str, Any]) -> str:
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template.strip() else PLAIN_TEMPLATE
