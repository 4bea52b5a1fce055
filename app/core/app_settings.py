"""App-wide settings (theme, defaults for new chats, compare mode), kept as JSON in the data folder."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.core.atomic_file import write_text_whole
from app.core.chat_settings import ChatSettings
from engine.errors import ParleyError

THEMES = ("system", "light", "dark")
WEIGHTS = ("auto", "quantized", "dequantized")


@dataclass(slots=True)
class AppSettings:
    theme: str = "system"  # system, light, dark
    defaults: ChatSettings = field(default_factory=ChatSettings)
    one_at_a_time: bool = False  # compare view: columns answer in turn (small machines)
    weights: str = "auto"  # how models load (engine --weights): auto, quantized, or dequantized floats
    window: dict = field(default_factory=dict)  # geometry (base64 of Qt's saveGeometry), splitter sizes, open chat
    drafts: dict[int, str] = field(default_factory=dict)  # unsent text per chat, kept across restarts
    presets: dict[str, dict] = field(default_factory=dict)  # name -> ChatSettings fields (app/core/presets.py)
    file: Path | None = None
    draft_model: str = ""  # the model key that drafts for the others (speculative decoding), "" for none
    read_only: bool = False  # another instance owns the data folder: this one saves nothing
    save_error: str = ""  # why the last save failed ("" after one that worked)

    @classmethod
    def load(cls, file: Path, read_only: bool = False) -> "AppSettings":
        """The settings in `file`, each value that does not read left at its default (never an error: a hand-edited
        or damaged file must not keep the app from opening). A file that is not settings at all is kept aside as
        `settings.json.damaged-<time>` before it is written over. `read_only`: never written (another Parley's)."""
        if not file.is_file():
            return cls(file=file, read_only=read_only)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8
            data = None
        if not isinstance(data, dict):
            if not read_only:
                _set_aside(file)
            return cls(file=file, read_only=read_only)
        theme, weights, draft = data.get("theme"), data.get("weights"), data.get("draft_model")
        return cls(theme if theme in THEMES else "system", ChatSettings.readable(data.get("defaults")),
                   data.get("one_at_a_time") is True, weights if weights in WEIGHTS else "auto",
                   _window(data.get("window")), _drafts(data.get("drafts")), _presets(data.get("presets")), file,
                   draft if isinstance(draft, str) else "", read_only)

    def save(self) -> bool:
        """Writes the settings; False (and nothing raised) where the data folder cannot be written."""
        if self.file is None or self.read_only:
            return False
        data = {"theme": self.theme, "defaults": self.defaults.to_dict(), "one_at_a_time": self.one_at_a_time,
                "weights": self.weights, "window": self.window, "drafts": {str(k): v for k, v in self.drafts.items()},
                "presets": self.presets, "draft_model": self.draft_model}
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            write_text_whole(self.file, json.dumps(data, indent=1))
        except OSError as exc:
            self.save_error = exc.strerror or str(exc)
            return False
        self.save_error = ""
        return True


def _set_aside(file: Path) -> None:
    """Keeps a file that does not read as settings (a hand edit's missing comma) beside it, never deleted."""
    try:
        file.replace(file.with_name(f"{file.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"))
    except OSError:
        pass


def _window(data) -> dict:
    """The window's saved geometry (base64 text of Qt's saveGeometry), sidebar width and open chat, where they read."""
    if not isinstance(data, dict):
        return {}
    out = {}
    if isinstance(data.get("geometry"), str) and data["geometry"].isascii():
        out["geometry"] = data["geometry"]
    if type(data.get("sidebar")) is int and 0 < data["sidebar"] < 1 << 16:
        out["sidebar"] = data["sidebar"]
    if type(data.get("chat")) is int:
        out["chat"] = data["chat"]
    return out


def _presets(data) -> dict[str, dict]:
    """Presets that read as settings (an edited or damaged entry is left out, not fatal)."""
    out = {}
    for name, values in (data.items() if isinstance(data, dict) else ()):
        try:
            if isinstance(name, str) and isinstance(values, dict):
                ChatSettings.from_dict(values)
                out[name] = values
        except (TypeError, ValueError, ParleyError):
            continue
    return out


def _drafts(data) -> dict[int, str]:
    if not isinstance(data, dict):
        return {}
    return {int(k): v for k, v in data.items() if str(k).isdigit() and isinstance(v, str)}
