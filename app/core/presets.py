"""Named presets: a system prompt and sampling settings saved under a name, applied to any chat or compare column
(the chat keeps its own model). Kept in the app settings file."""
from __future__ import annotations

from app.core.app_settings import AppSettings
from app.core.chat_settings import ChatSettings

MAX_NAME = 60


class Presets:
    def __init__(self, settings: AppSettings):
        self._settings = settings

    def names(self) -> list[str]:
        return sorted(self._settings.presets, key=str.casefold)

    def get(self, name: str, model: str | None = None) -> ChatSettings:
        """The preset's settings, with `model` as the model (a preset never changes which model answers)."""
        return ChatSettings.from_dict({**self._settings.presets[name], **({"model": model} if model else {})})

    def save(self, name: str, settings: ChatSettings) -> str:
        """Stores `settings` (without its model) as `name` (trimmed; replaces a preset of that name); the name."""
        name = " ".join(name.split())[:MAX_NAME]
        if not name:
            raise ValueError("A preset needs a name.")
        data = settings.to_dict()
        data.pop("model", None)
        self._settings.presets[name] = data
        self._settings.save()
        return name

    def delete(self, name: str) -> None:
        if self._settings.presets.pop(name, None) is not None:
            self._settings.save()
