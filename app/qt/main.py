"""Builds the GUI app (store, engine bridge, models, chat service, window) and runs it on a qasync loop."""
from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from functools import partial

from PySide6.QtWidgets import QApplication

from app.core.app_settings import AppSettings
from app.core.conversations import ConversationStore
from app.core.sqlite_registry import SqliteModelRegistry
from app.core.sqlite_store import SqliteConversationStore
from app.qt.bridge import EngineBridge
from app.qt.chats import QtChatService
from app.qt.gui_collector import GuiThreadCollector
from app.qt.model_manager import DFLASH_KEY, ModelManager
from cli.paths import Paths
from engine.loading.default_model import DEFAULT_NAME
from engine.runtime import EngineConfig

GUI_ENGINE = dict(max_sessions=8, max_session_tokens=4096)


@dataclass
class Parley:
    """Everything one running app holds; `close()` ends the engine thread."""

    paths: Paths
    settings: AppSettings
    bridge: EngineBridge
    models: ModelManager
    store: ConversationStore
    service: QtChatService
    window: object = None
    collector: GuiThreadCollector | None = None
    extra: dict = field(default_factory=dict)

    def close(self) -> None:
        if self.window is not None:
            self.window.close()
        self.bridge.shutdown()
        self.store.close()  # after the engine: the last streamed text is in memory by then
        if self.collector is not None:
            self.collector.stop()


def build(data_dir: str | None = None, default_model: str = DEFAULT_NAME, engine: EngineConfig | None = None,
          theme: str | None = None, show: bool = True) -> Parley:
    """Needs a QApplication. `default_model` is 'default' (the embedded Gemma) or a model path (tests)."""
    from app.qt.drops import FileDrops
    from app.qt.persist_ui import PersistenceUI
    from app.qt.window import MainWindow

    paths = Paths.resolve(data_dir)
    store = SqliteConversationStore(paths.data / "parley.db")
    # a second Parley on the same folder shows its chats read-only, and its settings too: closing it must not write
    # over the first one's presets and drafts
    settings = AppSettings.load(paths.data / "settings.json", read_only=store.locked_out)
    settings.launch_theme = theme  # shown, not saved: a flag for one launch must not become the saved choice
    config = engine or EngineConfig(cache_dir=paths.cache, weights=settings.weights, **GUI_ENGINE)
    bridge = EngineBridge(config).start()
    registry = SqliteModelRegistry(store, default_spec=default_model, legacy_file=paths.data / "models.json")
    models = ModelManager(bridge, registry, paths.models)
    if settings.draft_model.startswith(DFLASH_KEY):
        models.use_dflash(settings.draft_model[len(DFLASH_KEY):])  # a file moved away since: lookup, as before
    elif settings.draft_model and registry.get(settings.draft_model) is not None:
        models.use_as_draft(settings.draft_model)
    models.draft_changed.connect(partial(_keep_draft, settings))
    service = QtChatService(store, bridge, models, settings.defaults)
    service.restore_drafts(settings.drafts)
    app = Parley(paths, settings, bridge, models, store, service)
    app.window = MainWindow(service, models, settings)
    app.extra["persistence"] = PersistenceUI(app.window, service)
    app.extra["drops"] = FileDrops(app.window, [app.window.chat.composer.edit, app.window.compare.composer.edit],
                                   app.extra["persistence"].import_from)
    _tell_at_start(app.window, " ".join(filter(None, (settings.notice, getattr(store, "settings_notice", "")))))
    chats = [c.id for c in store.conversations()]
    if chats:
        last = settings.window.get("chat")  # the chat open at close, if it is still there
        app.window.open_chat(last if last in chats else chats[0])
        app.window.focus_composer()  # else the New chat button had it: typed text went nowhere, Space made a chat
    else:
        app.window.new_chat()
    if show:
        app.window.show()
    app.collector = GuiThreadCollector().start()  # from now on cycles are freed on this (the GUI) thread only
    return app


def _tell_at_start(window, notice: str) -> None:
    """Settings that did not read, said once: on stderr and in the status bar, after any notice already there."""
    if not notice:
        return
    print(f"parley: {notice}", file=sys.stderr)
    bar = window.statusBar()
    bar.showMessage(" ".join(filter(None, (bar.currentMessage(), notice))), 20000)


def _keep_draft(settings: AppSettings, key: str) -> None:
    settings.draft_model = key
    settings.save()


def qt_app(argv: list[str] | None = None) -> QApplication:
    app = QApplication.instance() or QApplication(argv or sys.argv[:1])
    app.setApplicationName("Parley")
    return app


def run_gui(data_dir: str | None = None, theme: str | None = None) -> int:
    import qasync

    qapp = qt_app()
    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    parley = build(data_dir, theme=theme)
    closed = asyncio.Event()
    qapp.aboutToQuit.connect(closed.set)
    try:
        with loop:
            loop.run_until_complete(closed.wait())
    finally:
        parley.bridge.shutdown()
        parley.store.close()
        parley.collector.stop()
        tell_at_quit(parley.store)
    return 0


def tell_at_quit(store: ConversationStore) -> None:
    """Says where changes a locked database held back at quit went (the window is gone: a box, and stderr)."""
    if getattr(store, "kept", None) is None:
        return
    from PySide6.QtWidgets import QMessageBox

    print(f"parley: {store.notice}", file=sys.stderr)
    QMessageBox.warning(None, "Parley", store.notice)
