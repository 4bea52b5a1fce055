"""ModelManager: which registry models are loaded in the engine, loading on demand, importing from disk."""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.core.model_registry import ModelEntry, ModelRegistry
from app.core.sqlite_registry import check_model
from app.qt.background import Background
from app.qt.bridge import EngineBridge
from app.qt.gui_collector import ModelFreezer
from engine.loading.default_model import DEFAULT_NAME, FILE_NAME, default_model_path, resolve_model
from engine.loading.gguf_header import scan_header
from engine.loading.gguf_split import model_files, shown_name
from engine.loading.template_probe import template_thinking_switch


@dataclass(slots=True)
class ModelState:
    entry: ModelEntry
    status: str = "loading"  # loading, loaded, failed
    model_id: int | None = None
    name: str = ""  # once loaded, the name it is listed under: every view names it so (the picker, answers, the bar)
    own_name: str = ""  # the name its file gives itself ("Gemma 3 270m"), as the engine's notices say it
    own_context: int | None = None  # the context length it was made for (info's "context" is what a chat gets of it)
    stage: str = ""
    fraction: float = 0.0
    message: str = ""
    info: dict | None = None
    drafter: str = ""  # the draft_key its load began with: the model (or DFlash file) that drafts for it
    started: float = field(default_factory=time.monotonic)  # the status bar counts the seconds of a load


DFLASH_KEY = "dflash:"  # draft_key of a DFlash drafter file (registry keys never start so)


class ModelManager(QObject):
    changed = Signal(str)  # a model key whose state changed (progress included)
    loaded = Signal(str)
    failed = Signal(str, str)  # key, message
    imported = Signal(str)
    import_failed = Signal(str, str)  # path, message
    already_there = Signal(str, str)  # path, key: an identical copy of a model the registry has
    refused = Signal(str, str)  # path, why: an import whose check found it is not a model Parley runs
    thinking_known = Signal(str)  # a model key whose template's thinking switch was read off the GUI thread
    own_name_known = Signal(str)  # a model key whose file's own name was read off the GUI thread (not loaded)
    context_known = Signal(str)  # a model key whose own context length was read off the GUI thread
    _resolved = Signal(str, str)  # key, path: the embedded file is assembled off the GUI thread
    _context_read = Signal(str, int, int)  # key, model id, its own context length: read off the GUI thread
    draft_changed = Signal(str)  # the key of the model that drafts for the others ("" for none)

    def __init__(self, bridge: EngineBridge, registry: ModelRegistry, models_dir: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.bridge, self.registry, self.models_dir = bridge, registry, models_dir
        self.states: dict[str, ModelState] = {}
        self._by_id: dict[int, str] = {}
        self._importing: set[str] = set()
        self._dropped: set[int] = set()  # loads given up (their model went off the list): freed when they arrive
        self._files: dict[str, str] = {}  # key -> the file or folder it loads (the embedded one once assembled)
        self._own_names: dict[str, str] = {}  # key -> its file's own name, kept after an unload (for listed())
        self._naming: set[str] = set()  # keys whose own name was asked of their file (once: a file gone stays unknown)
        self.draft_key = ""  # the model that drafts for models loaded from now on (speculative decoding)
        self._switches: dict[tuple, bool | None] = {}  # (file, its size and time) -> its template's thinking switch
        self._probing: set[tuple] = set()  # file versions whose template is being read
        self.background = Background(self)
        self.freezer = ModelFreezer(bridge, parent=self)  # loaded models out of full collections
        bridge.model_progress.connect(self._on_progress)
        bridge.model_loaded.connect(self._on_loaded)
        bridge.model_unloaded.connect(self._on_unloaded)
        bridge.model_failed.connect(self._on_failed)
        self._resolved.connect(self._load_path)
        self._context_read.connect(self._on_context_read)

    def model_id(self, key: str) -> int | None:
        state = self.states.get(key)
        return state.model_id if state is not None and state.status == "loaded" else None

    def state(self, key: str) -> ModelState | None:
        return self.states.get(key)

    def listed(self, saved: str, prefer: str | None = None) -> str:
        """The name a model is listed under for `saved`, the name an answer was saved under: answers saved by older
        versions carry the file's own name ('qwen3' for 'qwen3-f32.gguf'). Known for models loaded since the start
        (`prefer`, the chat's model, first where two files share a name), and read from the files of the others off
        the GUI thread (`own_name_known` once each is); `saved` as it is otherwise."""
        entries = self.registry.entries()
        if not saved or any(e.name == saved for e in entries):
            return saved
        if prefer is not None and self._own_names.get(prefer) == saved and (entry := self.registry.get(prefer)):
            return entry.name
        owners = [e for e in entries if self._own_names.get(e.key) == saved]
        if not owners:
            self._read_own_names(entries)
        return owners[0].name if len(owners) == 1 else saved

    def _read_own_names(self, entries: list[ModelEntry]) -> None:
        """The own names of listed models not loaded since the start, from their files' headers (not their weights)."""
        for entry in entries:
            if entry.key in self._own_names or entry.key in self._naming:
                continue
            path = self._listed_files().get(entry.key)
            if entry.kind == "embedded" and entry.path != DEFAULT_NAME:
                path = entry.path  # a default model given by its path (--model, the tests)
            if path is None:  # the embedded file not assembled yet: no answer of it was saved here
                continue
            self._naming.add(entry.key)
            self.background.run(partial(own_name, path), partial(self._named, entry.key))

    def _named(self, key: str, name: str | None, error: Exception | None) -> None:
        if error is None and name and key not in self._own_names:  # a load's word came first: it stands
            self._own_names[key] = name
            self.own_name_known.emit(key)

    def file_of(self, key: str) -> str | None:
        """The file or folder a model loads from (the embedded one's once it is assembled)."""
        entry = self.registry.get(key)
        if key in self._files:
            return self._files[key]
        return entry.path if entry is not None and entry.kind != "embedded" else None

    def thinking_switch(self, key: str) -> bool | None:
        """Whether a model's chat template reads the Thinking setting: its load's word once loaded, its file's header
        before; None where neither says, or while the file is read (off the GUI thread, once per file version: a
        GGUF's takes 0.2-0.5 s for the embedded model), after which `thinking_known` is emitted with `key`."""
        state = self.states.get(key)
        if state is not None and state.status == "loaded":
            return (state.info or {}).get("thinking_switch")
        path = self.file_of(key)
        if path is None:
            return None
        try:
            stat = Path(path).stat()
        except OSError:
            return None
        version = (path, stat.st_size, stat.st_mtime_ns)
        if version not in self._switches and version not in self._probing:
            self._probing.add(version)
            probe = partial(template_thinking_switch, Path(path), self.bridge.engine.config.cache_dir)
            self.background.run(probe, partial(self._probed, version, key))
        return self._switches.get(version)

    def _probed(self, version: tuple, key: str, switch: bool | None, error: Exception | None) -> None:
        self._probing.discard(version)
        self._switches[version] = None if error is not None else switch
        self.thinking_known.emit(key)

    def use_as_draft(self, key: str | None) -> bool:
        """Models loaded from now on draft with `key` (None: from their prompts). False when it has no file yet."""
        path = None
        if key:
            entry = self.registry.get(key)
            path = self.file_of(key) or (str(default_model_path(self.models_dir)) if entry and entry.kind == "embedded"
                                         else None)
            if path is None:
                return False
        self.bridge.engine.set_draft_model(Path(path) if path else None)
        self.draft_key = key or ""
        self.draft_changed.emit(self.draft_key)
        return True

    def use_dflash(self, path: str | None) -> bool:
        """Models loaded from now on draft with the DFlash drafter at `path` (trained for them: training/dflash.py),
        or, with None, from their prompts. False when `path` is not a drafter file."""
        from engine.speculative.dflash_net import is_dflash_file

        if path and not is_dflash_file(Path(path)):
            return False
        self.bridge.engine.set_draft_model(Path(path) if path else None)
        self.draft_key = f"{DFLASH_KEY}{path}" if path else ""
        self.draft_changed.emit(self.draft_key)
        return True

    def dflash_file(self) -> str | None:
        """The DFlash drafter models load with, if one was chosen."""
        return self.draft_key[len(DFLASH_KEY):] if self.draft_key.startswith(DFLASH_KEY) else None

    def unload(self, key: str) -> bool:
        """Frees a loaded model (its chats' running turns end as closed; their next turn loads it again). A model
        still loading is given up: chats waiting for it end with an error, and it is freed once it arrives."""
        state = self.states.get(key)
        if state is not None and state.status == "loading" and state.model_id is not None:
            return self._give_up(key, state.model_id)
        if state is None or state.status != "loaded" or state.model_id is None:
            return False
        self.bridge.engine.unload_model(state.model_id)
        self._by_id.pop(state.model_id, None)  # shown unloaded at once, not when the engine says so
        del self.states[key]
        self.changed.emit(key)
        return True

    def _give_up(self, key: str, model_id: int) -> bool:
        self._dropped.add(model_id)
        self._by_id.pop(model_id, None)
        del self.states[key]
        self.changed.emit(key)
        self.failed.emit(key, "it was unloaded or taken off the list before it finished loading.")
        return True

    def ensure(self, key: str) -> None:
        """Starts loading `key` unless it is loaded or loading; a failed model is tried again."""
        state = self.states.get(key)
        if state is not None and state.status != "failed":
            return
        entry = self.registry.get(key)
        if entry is None:
            self.failed.emit(key, f"Unknown model {key!r}.")
            return
        self.states[key] = ModelState(entry, stage="Preparing")
        self.changed.emit(key)
        if entry.path == DEFAULT_NAME:
            threading.Thread(target=self._resolve_default, args=(key,), daemon=True, name="parley-resolve").start()
        else:
            self._load_path(key, entry.path)

    def importing(self) -> list[ModelEntry]:
        """Models being imported (checked, then loaded), listed before they join the registry."""
        return [state.entry for key, state in self.states.items() if key in self._importing]

    def import_path(self, path: str | Path) -> str:
        """Starts importing a GGUF file or HF folder: its headers are checked and its bytes compared with the models
        listed off the GUI thread (0.2-0.5 s for a large vocabulary), then it loads, and joins the registry once it
        has. Returns the key it is imported under; ValueError at once for a path that is no model file or folder.
        `refused` tells a check that fails, `imported` (with `already_there`) a copy of a model already listed."""
        entry = self.registry.candidate(path, check=False)
        if self.registry.get(entry.key) is not None:
            self.imported.emit(entry.key)
            return entry.key
        if entry.key in self._importing:  # imported again while it is checked or loads: `imported` comes once it has
            return entry.key
        self._importing.add(entry.key)
        self.states[entry.key] = ModelState(entry, stage="Checking")  # the status bar shows it at once
        self.changed.emit(entry.key)
        listed = self._listed_files()
        self.background.run(partial(_check_import, entry.path, listed), partial(self._checked, entry, str(path)))
        return entry.key

    def _listed_files(self) -> dict[str, str]:
        """Each listed model's file, the embedded one's as soon as it is on disk: before its first load had begun, a
        copy of it imported was taken for another model and loaded beside it (249 MB twice)."""
        listed = {e.key: e.path for e in self.registry.entries() if e.kind != "embedded"}
        embedded, assembled = self.registry.default, Path(self.models_dir) / FILE_NAME
        if embedded.path == DEFAULT_NAME and assembled.is_file():
            listed[embedded.key] = str(assembled)
        return {**listed, **self._files}

    def _checked(self, entry: ModelEntry, path: str, copies: list[str], error: Exception | None) -> None:
        """The import's check is back (GUI thread): refused, a copy of a listed model, or on to the engine's load."""
        if entry.key not in self._importing or not self.bridge.engine.running:  # the app closed meanwhile
            return
        same = next((key for key in copies or () if self.registry.get(key) is not None), None)
        if error is None and same is None:
            self._load_path(entry.key, entry.path)
            return
        self._importing.discard(entry.key)
        del self.states[entry.key]
        self.changed.emit(entry.key)
        if error is not None:
            self.refused.emit(path, str(error) if isinstance(error, ValueError) else f"{path}: {error}")
        else:  # a copy: no second load, no second converted cache, no second entry
            self.imported.emit(same)
            self.already_there.emit(path, same)

    def _resolve_default(self, key: str) -> None:
        try:
            path = str(resolve_model(DEFAULT_NAME, self.models_dir))
        except Exception as exc:  # reported on the GUI thread like any load failure
            self._resolved.emit(key, f"!{exc}")
            return
        self._resolved.emit(key, path)

    def _load_path(self, key: str, path: str) -> None:
        if path.startswith("!"):
            self._fail(key, path[1:])
            return
        model_id = self.bridge.engine.load_model(path)
        self._files[key] = path
        self.states[key].model_id, self.states[key].drafter = model_id, self.draft_key
        self._by_id[model_id] = key

    def _on_progress(self, model_id: int, stage: str, fraction: float) -> None:
        key = self._by_id.get(model_id)
        if key is not None:
            self.states[key].stage, self.states[key].fraction = stage, fraction
            self.changed.emit(key)

    def _on_loaded(self, model_id: int, name: str, info: object) -> None:
        if model_id in self._dropped:  # nobody waits for it any more
            self._dropped.discard(model_id)
            self.bridge.engine.unload_model(model_id)
            return
        key = self._by_id.get(model_id)
        if key is None:
            return
        state = self.states[key]
        state.status, state.info, state.fraction = "loaded", dict(info or {}), 1.0
        state.name, state.own_name = state.entry.name, name
        self._own_names[key] = name
        self.freezer.loaded()
        if not state.info.get("remote"):  # asked off the GUI thread, which would wait for the engine's step to end
            threading.Thread(target=self._ask_context, args=(key, model_id), daemon=True, name="parley-context").start()
        if key in self._importing:
            self._importing.discard(key)
            self.registry.add(state.entry)
            self.imported.emit(key)
        self.changed.emit(key)
        self.loaded.emit(key)

    def _ask_context(self, key: str, model_id: int) -> None:
        """Its own thread: the context length the model was made for, back to the GUI thread."""
        try:
            context = self.bridge.engine.loaded_model(model_id).args.max_position_embeddings
            self._context_read.emit(key, model_id, context)
        except Exception:  # noqa: BLE001 - unloaded meanwhile, the engine shut down, the app gone: no figure shown
            pass

    def _on_context_read(self, key: str, model_id: int, context: int) -> None:
        state = self.states.get(key)
        if state is not None and state.model_id == model_id:  # not unloaded (and loaded again) meanwhile
            state.own_context = context
            self.context_known.emit(key)

    def _on_unloaded(self, model_id: int) -> None:
        """The engine let a model go that this manager had not unloaded (a caller of the engine's own): it is shown
        unloaded, and a chat's next turn loads it again rather than opening a session on an id that is gone."""
        key = self._by_id.pop(model_id, None)
        if key is not None and key in self.states and self.states[key].model_id == model_id:
            del self.states[key]
            self.changed.emit(key)

    def _on_failed(self, model_id: int, message: str) -> None:
        self._dropped.discard(model_id)
        key = self._by_id.get(model_id)
        if key is not None:
            self._fail(key, message)

    def _fail(self, key: str, message: str) -> None:
        state = self.states[key]
        state.status, state.message, state.model_id = "failed", message, None
        if key in self._importing:
            self._importing.discard(key)
            del self.states[key]
            self.import_failed.emit(key, message)
            return
        self.changed.emit(key)
        self.failed.emit(key, message)


def own_name(path: str) -> str:
    """Worker thread: the name a model's load gives it (engine/loading/loader.py): a folder's name, a GGUF file's
    general.name where it is one sensible line, else its file's name."""
    p = Path(path)
    if p.is_dir():
        return p.name
    return shown_name(str(scan_header(p).scalars.get("general.name") or ""), p)


def _check_import(path: str, listed: dict[str, str]) -> list[str]:
    """Worker thread: ValueError saying why `path` is not a model Parley runs; else the keys of the listed models whose
    files hold the same bytes (the same path counts: the embedded model's file imported by its path is the embedded
    model)."""
    check_model(path)
    wanted = fingerprint(path)
    return [key for key, other in listed.items() if fingerprint(other) == wanted]


SAMPLE_BYTES = 1 << 20  # read from each end of a file: enough to tell models apart without reading gigabytes
_prints: dict[tuple, tuple] = {}


def fingerprint(path: str) -> tuple:
    """What identifies a model's bytes: size and hashes of its ends (per file for a Hugging Face folder and for a
    split model's parts)."""
    p = Path(path)
    try:
        files = model_files(p)
        return tuple((f.name if p.is_dir() else "", *_file_print(f)) for f in files)
    except OSError:
        return (path,)  # unreadable: equal only to itself


def _file_print(f: Path) -> tuple[int, str]:
    st = f.stat()
    key = (str(f), st.st_size, st.st_mtime_ns)
    if key not in _prints:
        digest = hashlib.blake2b(digest_size=16)
        with f.open("rb") as fh:
            digest.update(fh.read(SAMPLE_BYTES))
            if st.st_size > SAMPLE_BYTES:
                fh.seek(max(SAMPLE_BYTES, st.st_size - SAMPLE_BYTES))
                digest.update(fh.read(SAMPLE_BYTES))
        _prints[key] = (st.st_size, digest.hexdigest())
    return _prints[key]
