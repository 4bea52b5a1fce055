"""App-wide settings (theme, defaults for new chats, compare mode), kept as JSON in the data folder."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from app.core.chat_settings import ChatSettings


@dataclass(slots=True)
class AppSettings:
    theme: str = "system"  # system, light, dark
    defaults: ChatSettings = field(default_factory=ChatSettings)
    one_at_a_time: bool = False  # compare view: columns answer in turn (small machines)
    weights: str = "auto"  # how models load (engine --weights): auto, quantized, or dequantized floats
    window: dict = field(default_factory=dict)  # geometry (base64 of Qt's saveGeometry), splitter sizes
    drafts: dict[int, str] = field(default_factory=dict)  # unsent text per chat, kept across restarts
    presets: dict[str, dict] = field(default_factory=dict)  # name -> ChatSettings fields (app/core/presets.py)
    file: Path | None = None
    draft_model: str = ""  # the model key that drafts for the others (speculative decoding), "" for none

    @classmethod
    def load(cls, file: Path) -> "AppSettings":
        if not file.is_file():
            return cls(file=file)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
            weights = data.get("weights", "auto")
            window, drafts = data.get("window", {}), data.get("drafts", {})
            draft = data.get("draft_model", "")
            return cls(data.get("theme", "system"), ChatSettings.from_dict(data.get("defaults", {})),
                       bool(data.get("one_at_a_time", False)),
                       weights if weights in ("auto", "quantized", "dequantized") else "auto",
                       window if isinstance(window, dict) else {}, _drafts(drafts), _presets(data.get("presets")),
                       file, draft if isinstance(draft, str) else "")
        except (ValueError, TypeError):
            return cls(file=file)  # a damaged file falls back to defaults rather than blocking the start

    def save(self) -> None:
        if self.file is None:
            return
        self.file.parent.mkdir(parents=True, exist_ok=True)
        data = {"theme": self.theme, "defaults": self.defaults.to_dict(), "one_at_a_time": self.one_at_a_time,
                "weights": self.weights, "window": self.window, "drafts": {str(k): v for k, v in self.drafts.items()},
                "presets": self.presets, "draft_model": self.draft_model}
        self.file.write_text(json.dumps(data, indent=1), encoding="utf-8")


def _presets(data) -> dict[str, dict]:
    """Presets that read as settings (an edited or damaged entry is left out, not fatal)."""
    out = {}
    for name, values in (data.items() if isinstance(data, dict) else ()):
        try:
            if isinstance(name, str) and isinstance(values, dict):
                ChatSettings.from_dict(values)
                out[name] = values
        except (TypeError, ValueError):
            continue
    return out


def _drafts(data) -> dict[int, str]:
    if not isinstance(data, dict):
        return {}
    return {int(k): v for k, v in data.items() if str(k).isdigit() and isinstance(v, str)}
