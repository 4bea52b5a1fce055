"""App-wide settings (theme, defaults for new chats, compare mode), kept as JSON in the data folder."""
from __future__ import annotations

import copy
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from app.core.atomic_file import write_text_whole
from app.core.chat_settings import ChatSettings, unread_value
from app.core.settings_merge import merged
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
    unread: list[str] = field(default_factory=list)  # the file's values that did not read, for the start's notice
    aside: Path | None = None  # where the file as it was is kept when some of it did not read
    # as_json() at the load or the last save, what a save compares them with; None: the file did not read whole (the
    # next save writes these settings as they are, the defaults in place of what did not read)
    base: dict | None = field(default=None, repr=False)
    launch_theme: str | None = None  # `parley --theme`: this launch's colours, never saved (the saved choice is theme)
    edits: dict[int, tuple[int, str]] = field(default_factory=dict)  # per chat, an edit in progress: (message, text)

    @property
    def shown_theme(self) -> str:
        """The theme the window shows: this launch's --theme, else the saved one."""
        return self.launch_theme or self.theme

    @classmethod
    def load(cls, file: Path, read_only: bool = False) -> "AppSettings":
        """The settings in `file`, each value that does not read left at its default (never an error: a hand-edited
        or damaged file must not keep the app from opening). A file that is not settings at all is kept aside as
        `settings.json.damaged-<time>` before it is written over, and so is a copy of one where some value did not
        read (the next save writes the defaults over it). `read_only`: never written (another Parley's)."""
        if not file.is_file():
            return cls(file=file, read_only=read_only).synced()
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8
            data = None
        if not isinstance(data, dict):
            aside = None if read_only else _set_aside(file, file.replace)
            return cls(file=file, read_only=read_only, unread=["the whole file (not settings)"],
                       aside=aside).synced()
        r = _Reader(data, [])
        settings = cls(r.get("theme", str, THEMES.__contains__, _one_of(THEMES)) or "system",
                       ChatSettings.readable(r.get("defaults", dict), r.unread, "defaults"),
                       r.get("one_at_a_time", bool) or False,
                       r.get("weights", str, WEIGHTS.__contains__, _one_of(WEIGHTS)) or "auto",
                       _window(r.inner("window")), _drafts(r.inner("drafts")), _presets(r.inner("presets")), file,
                       r.get("draft_model", str) or "", read_only, unread=r.unread, edits=_edits(r.inner("edits")))
        if r.unread and not read_only:
            settings.aside = _set_aside(file, lambda aside: shutil.copyfile(file, aside))
        return settings if r.unread else settings.synced()

    def synced(self) -> "AppSettings":
        """Notes what these settings hold now, as what the next save's merge compares them with."""
        self.base = copy.deepcopy(self.as_json())  # a copy: the dicts in it change in place
        return self

    def as_json(self) -> dict:
        return {"theme": self.theme, "defaults": self.defaults.to_dict(), "one_at_a_time": self.one_at_a_time,
                "weights": self.weights, "window": self.window, "drafts": {str(k): v for k, v in self.drafts.items()},
                "presets": self.presets, "draft_model": self.draft_model,
                "edits": {str(k): [msg_id, text] for k, (msg_id, text) in self.edits.items()}}

    @property
    def notice(self) -> str:
        """The start's one line about values of the file that did not read; "" where all did."""
        if not self.unread:
            return ""
        kept = f" The file as it was is kept as {self.aside.name}." if self.aside else ""
        if self.unread == ["the whole file (not settings)"]:
            return f"{self.file.name} did not read (not JSON settings): the defaults are used.{kept}"
        shown = "; ".join(self.unread[:3]) + (f"; and {len(self.unread) - 3} more" if len(self.unread) > 3 else "")
        many = len(self.unread) > 1
        return (f"{self.file.name}: {len(self.unread)} value{'s' * many} did not read and {'are' if many else 'is'} "
                f"left at the default{'s' * many}: {shown}.{kept}")

    def save(self) -> bool:
        """Writes the settings; False (and nothing raised) where the data folder cannot be written. A value another
        program changed in the file since Parley read or wrote it is kept, unless Parley changed it too: every save
        (a draft typed, the quit) wrote the whole file from memory over such an edit."""
        if self.file is None or self.read_only:
            return False
        ours, theirs = self.as_json(), _json_object(self.file)
        data = ours if theirs is None or self.base is None else merged(self.base, ours, theirs)
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            write_text_whole(self.file, json.dumps(data, indent=1))
        except OSError as exc:
            self.save_error = exc.strerror or str(exc)
            return False
        self.save_error = ""
        self.synced()
        return True


def _json_object(file: Path) -> dict | None:
    """The file's JSON object now; None where there is none or it does not read (Parley's settings are written)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _set_aside(file: Path, keep: Callable[[Path], object]) -> Path | None:
    """Keeps the file as it was beside it (`keep` moves or copies it there), never over an earlier one; None where
    the folder cannot be written (nothing will be written over then either)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = file.with_name(f"{file.name}.damaged-{stamp}")
    for n in range(2, 100):  # a second start within the same second does not write over the first one's
        if not aside.exists():
            break
        aside = file.with_name(f"{file.name}.damaged-{stamp}-{n}")
    try:
        keep(aside)
    except OSError:
        return None
    return aside


@dataclass(slots=True)
class _Reader:
    """Reads the values of one JSON object, noting in `unread` each one that is there but does not read."""
    data: dict
    unread: list[str]
    where: str = ""  # the object's own name, "window." say

    def get(self, key: str, kind: type, fits: Callable[[object], bool] = lambda _: True, accepts: str = ""):
        """data[key] where it is of `kind` and fits; None where it is absent or does not (noted)."""
        if key not in self.data:
            return None
        value = self.data[key]
        if type(value) is kind and fits(value):
            return value
        self.unread.append(unread_value(self.where + key, value, accepts or f"{_KINDS[kind]} expected"))
        return None

    def inner(self, key: str) -> "_Reader | None":
        value = self.get(key, dict)
        return None if value is None else _Reader(value, self.unread, f"{self.where}{key}.")


_KINDS = {bool: "true or false", str: "text", dict: "an object", int: "a whole number"}


def _one_of(choices: tuple[str, ...]) -> str:
    return "one of " + ", ".join(choices)


def _window(r: _Reader | None) -> dict:
    """The window's saved geometry (base64 text of Qt's saveGeometry), sidebar width and open chat, where they read."""
    if r is None:
        return {}
    values = {"geometry": r.get("geometry", str, str.isascii, "base64 text expected"),
              "sidebar": r.get("sidebar", int, lambda n: 0 <= n < 1 << 16, "a width from 0 to 65535"),  # 0: shut
              "chat": r.get("chat", int)}
    return {k: v for k, v in values.items() if v is not None}


def _edits(r: _Reader | None) -> dict[int, tuple[int, str]]:
    out = {}
    for k, v in r.data.items() if r else ():
        if k.isdigit() and isinstance(v, list) and len(v) == 2 and type(v[0]) is int and isinstance(v[1], str):
            out[int(k)] = (v[0], v[1])
        else:
            r.unread.append(unread_value(f"edits.{k}", v, "a chat's number and [its message's number, text] expected"))
    return out


def _presets(r: _Reader | None) -> dict[str, dict]:
    """Presets that read as settings (an edited or damaged entry is left out, not fatal)."""
    out = {}
    for name, values in r.data.items() if r else ():
        try:
            ChatSettings.from_dict(values)
            out[name] = values
        except (TypeError, ValueError, ParleyError, AttributeError) as exc:  # AttributeError: not an object
            r.unread.append(unread_value(f"presets.{name}", values, exc))
    return out


def _drafts(r: _Reader | None) -> dict[int, str]:
    out = {}
    for k, v in r.data.items() if r else ():
        if k.isdigit() and isinstance(v, str):
            out[int(k)] = v
        else:
            r.unread.append(unread_value(f"drafts.{k}", v, "a chat's number and its text expected"))
    return out
