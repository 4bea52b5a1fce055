"""The main window: sidebar of chats, the chat page or the compare view, menus, shortcuts and the load bar."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication, QFileDialog, QLabel, QMainWindow, QMessageBox, QProgressBar, QSplitter, QStackedWidget,
)

from app.core.app_settings import AppSettings
from app.qt.about import show_about
from app.qt.chat_page import ChatPage
from app.core.chats import ChatService
from app.qt.compare import CompareView
from app.qt.model_manager import ModelManager
from app.qt.settings_dialog import SettingsDialog
from app.qt.sidebar import Sidebar
from app.qt.theme import THEMES, apply_theme, icon


class MainWindow(QMainWindow):
    def __init__(self, service: ChatService, models: ModelManager, settings: AppSettings):
        super().__init__()
        self.service, self.models, self.app_settings = service, models, settings
        self.setWindowTitle("Parley")
        self.setWindowIcon(icon("parley"))
        self.resize(1200, 780)
        self.sidebar = Sidebar(service)
        self.chat = ChatPage(service, models)
        self.compare = CompareView(service, models, settings.one_at_a_time)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.chat)
        self.stack.addWidget(self.compare)
        split = QSplitter()
        split.addWidget(self.sidebar)
        split.addWidget(self.stack)
        split.setStretchFactor(1, 1)
        split.setSizes([260, 940])
        self.setCentralWidget(split)
        self._load_bar()
        self._menus()
        self._shortcuts()
        self.sidebar.selected.connect(self.open_chat)
        self.sidebar.new_requested.connect(self.new_chat)
        self.chat.settings_requested.connect(self.edit_settings)
        self.compare.promoted.connect(self.open_chat)
        self.compare.one_at_a_time.toggled.connect(self._save_one_at_a_time)
        service.conversations_changed.connect(self._on_conversations)
        models.changed.connect(self._on_model_state)
        models.import_failed.connect(lambda path, msg: self._warn("Import failed", f"{path}\n\n{msg}"))
        models.imported.connect(self._on_imported)
        self.dark = False
        self.set_theme(settings.theme)

    # -- chats
    def current(self) -> int | None:
        return self.chat.conv_id

    def new_chat(self) -> int:
        conv_id = self.service.new_conversation()
        self.open_chat(conv_id)
        self.chat.composer.edit.setFocus()
        return conv_id

    def open_chat(self, conv_id: int) -> None:
        self.stack.setCurrentWidget(self.chat)
        self.sidebar.set_current(conv_id)
        self.chat.open(conv_id)

    def step_chat(self, step: int) -> None:
        ids = self.sidebar.ids()
        if not ids:
            return
        i = ids.index(self.current()) if self.current() in ids else -step
        self.open_chat(ids[(i + step) % len(ids)])

    def show_compare(self) -> None:
        self.stack.setCurrentWidget(self.compare)
        self.compare.composer.edit.setFocus()

    def stop(self) -> None:
        if self.stack.currentWidget() is self.compare:
            self.compare.stop()
        else:
            self.chat.stop()

    def focus_composer(self) -> None:
        page = self.compare if self.stack.currentWidget() is self.compare else self.chat
        page.composer.edit.setFocus()

    def edit_settings(self) -> None:
        conv_id = self.current()
        if conv_id is None:
            return
        dialog = SettingsDialog(self.models.registry, self.service.store.get(conv_id).settings, parent=self)
        dialog.form.import_requested.connect(self.import_file)
        if dialog.exec():
            self.apply_settings(conv_id, dialog.settings(), dialog.as_default.isChecked())

    def apply_settings(self, conv_id: int, settings, as_default: bool = False) -> None:
        self.service.set_settings(conv_id, settings)
        self.chat.picker.reload(settings.model)
        if as_default:
            self.service.defaults = settings.copy()
            self.app_settings.defaults = settings.copy()
            self.app_settings.save()

    # -- models
    def import_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import a GGUF model", "", "GGUF models (*.gguf)")
        if path:
            self.import_model(path)

    def import_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Import a Hugging Face model folder")
        if path:
            self.import_model(path)

    def import_model(self, path: str) -> None:
        try:
            self.models.import_path(path)
        except ValueError as exc:
            self._warn("Not a model", str(exc))

    def _on_imported(self, key: str) -> None:
        self.chat.picker.reload()
        for column in self.compare.columns:
            column.picker.reload()
        self.statusBar().showMessage(f"Imported {self.models.registry.get(key).name}", 5000)

    def _load_bar(self) -> None:
        self.load_label = QLabel()
        self.load_progress = QProgressBar(maximumWidth=240, maximumHeight=14)
        self.load_progress.setRange(0, 100)
        self.statusBar().addPermanentWidget(self.load_label)
        self.statusBar().addPermanentWidget(self.load_progress)
        self.load_progress.hide()

    def _on_model_state(self, key: str) -> None:
        loading = [s for s in self.models.states.values() if s.status == "loading"]
        self.load_progress.setVisible(bool(loading))
        if loading:
            s = loading[0]
            self.load_label.setText(f"Loading {s.entry.name}: {s.stage}")
            self.load_progress.setValue(int(s.fraction * 100))
        else:
            state = self.models.state(key)
            failed = state is not None and state.status == "failed"
            self.load_label.setText(f"{state.entry.name} failed to load" if failed else "")
            if state is not None and state.status == "loaded":
                self.statusBar().showMessage(f"{state.name} loaded", 4000)

    # -- look
    def set_theme(self, mode: str) -> None:
        self.app_settings.theme = mode
        self.dark = apply_theme(QApplication.instance(), mode)
        for view in [self.chat.view] + [c.view for c in self.compare.columns]:
            view.set_dark(self.dark)
        for action in self._theme_actions.actions():
            action.setChecked(action.data() == mode)

    def _save_theme(self, mode: str) -> None:
        self.set_theme(mode)
        self.app_settings.save()

    def _save_one_at_a_time(self, on: bool) -> None:
        self.app_settings.one_at_a_time = on
        self.app_settings.save()

    def _on_conversations(self) -> None:
        if self.current() is not None and not self.service.store.has(self.current()):
            ids = self.sidebar.ids()
            if ids:
                self.open_chat(ids[0])
            else:
                self.new_chat()

    def _warn(self, title: str, text: str) -> None:
        """Window-modal but not blocking: the event loop (and every streaming chat) keeps going."""
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self.last_warning = box

    def _menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        file.addAction(icon("new"), "New chat", self.new_chat)
        file.addAction(icon("import"), "Import GGUF file…", self.import_file)
        file.addAction(icon("import"), "Import Hugging Face folder…", self.import_folder)
        file.addSeparator()
        file.addAction("Quit", QKeySequence.StandardKey.Quit, self.close)
        chat = bar.addMenu("&Chat")
        chat.addAction(icon("settings"), "Settings…", self.edit_settings)
        chat.addAction(icon("stop"), "Stop", self.stop)
        view = bar.addMenu("&View")
        view.addAction(icon("compare"), "Compare models", self.show_compare)
        themes = view.addMenu("Theme")
        self._theme_actions = QActionGroup(self)
        for mode in THEMES:
            action = QAction(mode.capitalize(), self, checkable=True, data=mode)
            action.triggered.connect(lambda _c=False, m=mode: self._save_theme(m))
            self._theme_actions.addAction(action)
            themes.addAction(action)
        help_menu = bar.addMenu("&Help")
        help_menu.addAction("About Parley", lambda: show_about(self, self.models))

    def _shortcuts(self) -> None:
        keys = [
            ("Ctrl+N", self.new_chat), ("Ctrl+Tab", lambda: self.step_chat(1)), ("Ctrl+PgDown", lambda: self.step_chat(1)),
            ("Ctrl+Shift+Tab", lambda: self.step_chat(-1)), ("Ctrl+PgUp", lambda: self.step_chat(-1)),
            ("Ctrl+.", self.stop), ("Ctrl+L", self.focus_composer), ("Ctrl+K", self.show_compare),
            ("Ctrl+,", self.edit_settings),
        ]
        self.shortcuts = {}
        for key, fn in keys:
            sc = QShortcut(QKeySequence(key), self, context=Qt.ShortcutContext.ApplicationShortcut)
            sc.activated.connect(fn)
            self.shortcuts[key] = sc
