"""The main window: sidebar of chats, the chat page or the compare view, menus, shortcuts and the load bar."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from PySide6.QtCore import QByteArray, QMargins, QRect, QSize, Qt, QTimer
from PySide6.QtGui import QAction, QActionGroup, QGuiApplication, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QApplication, QFileDialog, QMainWindow, QMessageBox, QProgressBar, QPushButton, QSizePolicy, QSplitter,
    QStackedWidget, QStyle,
)

from app.core.app_settings import AppSettings
from app.core.presets import Presets
from app.qt.about import show_about
from app.qt.chat_page import ChatPage
from app.core.chats import ChatService
from app.core.comparison import chats_and_comparisons
from app.qt.compare import CompareView
from app.qt.elided_label import ElidedLabel
from app.qt.live_panel import LivePanel
from app.qt.model_manager import ModelManager
from app.qt.models_dialog import ModelsDialog
from app.qt.notices import StatusMessages
from app.qt.settings_dialog import SettingsDialog, thinking_switch_of
from app.qt.sidebar import Sidebar
from app.qt.theme import THEMES, apply_theme, icon
from engine.loading.default_model import DEFAULT_NAME


UNDO_MS = 10_000  # how long a deleted chat can be brought back
NOTICE_MS = 20_000  # a load's notices stay up as long as the start's
DRAFT_SAVE_MS = 1500  # drafts reach settings.json this long after the last keystroke (a crash keeps them)
FIRST_SIZE = QSize(1200, 780)  # a first launch's window, where the screen has room for it
BORDER_GUESS = 4  # px a window manager's border may take on each side (unknown until the window is shown)


class MainWindow(QMainWindow):
    def __init__(self, service: ChatService, models: ModelManager, settings: AppSettings):
        super().__init__()
        self.service, self.models, self.app_settings = service, models, settings
        service.restore_edits(settings.edits)  # before a chat opens: it opens with its edit (saved by _save_drafts)
        self.setWindowTitle("Parley")
        self.setWindowIcon(icon("parley"))
        self.resize(FIRST_SIZE)
        self._undo_timer = QTimer(self, singleShot=True, interval=UNDO_MS)
        self._undo_timer.timeout.connect(self._forget_trash)
        self._load_ticker = QTimer(self, interval=500)  # a load with no new progress still shows time passing
        self._load_ticker.timeout.connect(lambda: self._on_model_state(""))
        self._draft_timer = QTimer(self, singleShot=True, interval=DRAFT_SAVE_MS)  # restarted by every edit
        self._draft_timer.timeout.connect(self._save_drafts)
        self.sidebar = Sidebar(service)
        self.chat = ChatPage(service, models)
        self.presets = Presets(settings)
        self.compare = CompareView(service, models, settings.one_at_a_time, presets=self.presets)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.chat)
        self.stack.addWidget(self.compare)
        self.stack.currentChanged.connect(self._size_by_current_page)
        self._size_by_current_page()
        split = self.splitter = QSplitter()
        split.addWidget(self.sidebar)
        split.addWidget(self.stack)
        split.setStretchFactor(1, 1)
        split.setCollapsible(0, False)
        split.setSizes([260, 940])
        self.setCentralWidget(split)
        self.live_panel = LivePanel(service, self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.live_panel)
        self.live_panel.hide()
        self.live_panel.open_requested.connect(self.open_any)
        # its columns waiting their turn and prompts queued went on after Stop all
        self.live_panel.stopping_all.connect(self.compare.stop)
        # after the layout pass that resized the page (a window resized, the panel shown or dragged), not inside it
        self.chat.resized.connect(self._fit_live_panel, Qt.ConnectionType.QueuedConnection)
        self._load_bar()
        self._menus()
        self.sidebar.selected.connect(self.open_chat)
        self.sidebar.new_requested.connect(self.start_chat)
        self.sidebar.delete_requested.connect(self.delete_chat)
        self.chat.settings_requested.connect(self.edit_settings)
        self.chat.composer.edit.textChanged.connect(self._draft_timer.start)
        service.draft_changed.connect(self._draft_timer.start)
        self.compare.promoted.connect(self.open_chat)
        self.compare.one_at_a_time.toggled.connect(self._save_one_at_a_time)
        service.conversations_changed.connect(self._on_conversations)
        models.changed.connect(self._on_model_state)
        models.import_failed.connect(lambda path, msg: self._warn("Import failed", f"{path}\n\n{msg}"))
        models.refused.connect(lambda _path, msg: self._warn("Not a model", msg))  # its check, off the GUI thread
        models.imported.connect(self._on_imported)
        models.loaded.connect(self._tell_load_notices)
        models.draft_changed.connect(self._tell_draft_applies)
        models.already_there.connect(self._on_already_there)
        self.dark = False
        self._show_theme()
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_color_scheme)
        QApplication.instance().fontChanged.connect(self._on_app_font)
        self._restore_geometry()

    # -- chats
    def current(self) -> int | None:
        return self.chat.conv_id

    def new_chat(self) -> int:
        self.sidebar.search.clear()  # a search would hide the new chat from the list
        conv_id = self.service.new_conversation()
        self.open_chat(conv_id)
        self.chat.composer.edit.setFocus()
        return conv_id

    def start_chat(self) -> int:
        """The user's New chat (Ctrl+N, the button): the chat open if it is still as New chat made it, else a new one;
        other chats left as made go (each Ctrl+N made another empty "New chat", kept across restarts)."""
        current = self.current()
        if current is not None and self._untouched(current):
            self.open_chat(current)
            self.sidebar.search.clear()
            self.chat.composer.edit.setFocus()
            return current
        conv_id = self.new_chat()
        self._drop_untouched(keep=conv_id)
        return conv_id

    def _untouched(self, conv_id: int) -> bool:
        return self.service.store.has(conv_id) and not self.service.trashed(conv_id) and self.service.untouched(conv_id)

    def _drop_untouched(self, keep: int | None) -> None:
        """Chats with nothing of the user's in them (no message, title, settings, pin or draft) go, but `keep`."""
        for conv in self.service.store.conversations():
            if conv.id != keep and self._untouched(conv.id):
                self.service.delete(conv.id)

    def open_chat(self, conv_id: int) -> None:
        self.stack.setCurrentWidget(self.chat)
        self.sidebar.set_current(conv_id)
        self.chat.open(conv_id)

    def delete_chat(self, conv_id: int) -> None:
        """Gone from the list at once; Undo (the status bar's button, Ctrl+Shift+Z) brings it back for a while."""
        title = self.service.store.get(conv_id).title
        if conv_id == self.current():
            self._open_neighbour(conv_id)
        self.service.trash(conv_id)
        self.undo_button.show()
        self.statusBar().showMessage(self.tr("Deleted “%1”.").replace("%1", title), UNDO_MS)
        self._undo_timer.start()

    def _open_neighbour(self, conv_id: int) -> None:
        """The chat below in the list, or above for the last one: the selection stays where the user was."""
        ids = self.sidebar.ids()
        if conv_id in ids and len(ids) > 1:
            i = ids.index(conv_id)
            self.open_chat(ids[i + 1] if i + 1 < len(ids) else ids[i - 1])

    def delete_current(self) -> None:
        if self.current() is not None and self.stack.currentWidget() is self.chat:
            self.delete_chat(self.current())

    def undo_delete(self) -> None:
        conv_id = self.service.restore()
        if conv_id is not None:
            self.open_chat(conv_id)
            self.statusBar().showMessage(self.tr("Restored “%1”.").replace("%1", self.service.store.get(conv_id).title), 4000)
        self.undo_button.setVisible(bool(self.service.in_trash()))

    def _forget_trash(self) -> None:
        self.undo_button.hide()
        self.service.empty_trash()

    def open_any(self, conv_id: int) -> None:
        """A chat from the sidebar, or a compare column (shown in its comparison)."""
        if not self.service.store.has(conv_id):
            return
        if self.service.store.get(conv_id).hidden:
            self.show_compare()
        else:
            self.open_chat(conv_id)

    def step_chat(self, step: int) -> None:
        ids = self.sidebar.ids()
        if not ids:
            return
        i = ids.index(self.current()) if self.current() in ids else -step
        self.open_chat(ids[(i + step) % len(ids)])

    def _fit_live_panel(self) -> None:
        """The Live panel beside the chat gives way first: narrower (to its least) while the chat page is narrower
        than comfortable, and back towards its natural width as room comes back; a width the user dragged it to that
        leaves the page its room is kept."""
        dock = self.live_panel
        sides = (Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea)
        beside = self.dockWidgetArea(dock) in sides
        if not (beside and self.chat.isVisible() and dock.isVisible() and not dock.isFloating()):
            return
        room, width = self.chat.width() - self.chat.comfortable_width(), dock.width()
        if room < 0:
            target = max(dock.minimumSizeHint().width(), width + room)
        else:
            target = max(width, min(dock.sizeHint().width(), width + room))  # never wider than the user left it
        if target != width:
            self.resizeDocks([dock], [target], Qt.Orientation.Horizontal)

    def _size_by_current_page(self, _index: int = -1) -> None:
        """Only the page on screen sets the window's minimum size (a hidden compare view must not widen a chat)."""
        current = self.stack.currentWidget()
        for i in range(self.stack.count()):
            page = self.stack.widget(i)
            policy = QSizePolicy.Policy.Preferred if page is current else QSizePolicy.Policy.Ignored
            page.setSizePolicy(policy, policy)

    def show_compare(self) -> None:
        self.compare.ensure_columns()
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
        """The settings of what is on screen: the chat, or in compare view the column in focus."""
        if self.stack.currentWidget() is self.compare:
            self.compare.edit_settings()
            return
        conv_id = self.current()
        if conv_id is None:
            return
        dialog = SettingsDialog(self.models.registry, self.service.store.get(conv_id).settings, parent=self,
                                presets=self.presets, thinking_switch=thinking_switch_of(self.models),
                                answering=self.service.busy(conv_id))
        dialog.form.import_requested.connect(self.import_file)
        if dialog.exec():
            self.apply_settings(conv_id, dialog.settings(), dialog.as_default.isChecked())

    def apply_settings(self, conv_id: int, settings, as_default: bool = False) -> None:
        self.service.set_settings(conv_id, settings)  # the chat's picker follows
        if as_default:
            self.service.defaults = settings.copy()
            self.app_settings.defaults = settings.copy()
            self._save_settings()

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

    def show_models(self) -> "ModelsDialog":
        dialog = ModelsDialog(self.models, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.import_requested.connect(self.import_file)
        dialog.removed.connect(self._on_removed)
        dialog.open()
        self.models_dialog = dialog
        return dialog

    def _on_imported(self, key: str) -> None:
        self.chat.picker.reload()
        for column in self.compare.columns:
            column.picker.reload()
        entry = self.models.registry.get(key)
        if entry is not None:
            self.statusBar().showMessage(self.tr("Imported %1").replace("%1", entry.name), 5000)

    def _on_removed(self, key: str) -> None:
        """A model taken off the list: its chats move to the embedded model and it is unloaded, so a picker never
        names one model while another answers."""
        moved = [c for c in self.service.store.conversations(include_hidden=True) if c.settings.model == key]
        for conv in moved:
            self.service.set_settings(conv.id, conv.settings.copy(model=DEFAULT_NAME))
        self.models.unload(key)
        self._on_imported(key)
        if what := self._counted([c.id for c in moved]):
            self.statusBar().showMessage(self.tr("Model removed from the list: %1 moved to %2").replace("%1", what)
                                         .replace("%2", self.models.registry.default.name), 8000)

    def _counted(self, conv_ids: list[int]) -> str:
        """ "1 chat and 1 comparison": a comparison's columns count once, as the user sees them (not '3 chats')."""
        chats, comparisons = chats_and_comparisons(self.service.store, conv_ids)
        parts = []
        if chats:
            parts.append(self.tr("1 chat") if chats == 1 else self.tr("%1 chats").replace("%1", str(chats)))
        if comparisons:
            parts.append(self.tr("1 comparison") if comparisons == 1
                         else self.tr("%1 comparisons").replace("%1", str(comparisons)))
        return self.tr(" and ").join(parts)

    def _on_already_there(self, path: str, key: str) -> None:
        name = self.models.registry.get(key).name
        self.statusBar().showMessage(self.tr("%1 is the same model as “%2”, already imported: it is not loaded twice.")
                                     .replace("%1", Path(path).name).replace("%2", name), 8000)

    def _load_bar(self) -> None:
        self.messages = StatusMessages(self.statusBar())  # each message kept whole: the bar cuts a long one
        self.undo_button = QPushButton(icon("delete"), self.tr("Undo delete"), flat=True)
        self.undo_button.setToolTip(self.tr("Bring back the chat just deleted (Ctrl+Shift+Z)"))
        self.undo_button.clicked.connect(self.undo_delete)
        self.undo_button.hide()
        self.load_label = ElidedLabel()  # a long model name ends in "…" (its tooltip has it all), never cut mid-word
        self.load_label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.load_progress = QProgressBar(maximumWidth=240)
        self.load_progress.setMaximumHeight(max(14, self.load_progress.fontMetrics().height()))  # its "40%" whole
        self.load_progress.setRange(0, 100)
        self.load_progress.setAccessibleName(self.tr("Model loading progress"))
        self.statusBar().addPermanentWidget(self.undo_button)
        self.statusBar().addPermanentWidget(self.load_label)
        self.statusBar().addPermanentWidget(self.load_progress)
        self.load_progress.hide()
        self._loaded_note = ("", "")  # (model key, text) of the '… loaded' message last shown

    def _on_model_state(self, key: str) -> None:
        loading = [s for s in self.models.states.values() if s.status == "loading"]
        self.load_progress.setVisible(bool(loading))
        if loading:
            s = loading[0]
            waited = time.monotonic() - s.started
            doing = self.tr("Loading %1: %2").replace("%1", s.entry.name).replace("%2", s.stage or self.tr("starting"))
            # the name and stage give way first: cut at the end, the seconds counting were never on screen
            self.load_label.setText(doing + self.tr(" · %1 s").replace("%1", str(int(waited))), head=len(doing))
            if s.fraction <= 0:
                self.load_progress.setRange(0, 0)  # no figure yet: the bar moves to say the load is alive
            else:
                self.load_progress.setRange(0, 100)
                self.load_progress.setValue(int(s.fraction * 100))
            if not self._load_ticker.isActive():
                self._load_ticker.start()
            return
        self._load_ticker.stop()
        state = self.models.state(key) if key else None
        if state is None:
            self._forget_model(key)
            return
        failed = state.status == "failed"
        self.load_label.setText(self.tr("%1 failed to load").replace("%1", state.entry.name) if failed else "")
        if state.status == "loaded" and not self.statusBar().currentMessage():  # a start's notice stays up its time
            self._loaded_note = (key, self.tr("%1 loaded").replace("%1", state.name))
            self.statusBar().showMessage(self._loaded_note[1], 4000)

    def _forget_model(self, key: str) -> None:
        """A model unloaded, given up while loading or refused at import: the bar says nothing of it any more (its
        '… loaded' stayed up its 4 s, a load given up kept 'Loading …: Checking · 0 s')."""
        self.load_label.setText("")
        if key and self._loaded_note == (key, self.statusBar().currentMessage()):
            self.statusBar().clearMessage()

    def _tell_load_notices(self, key: str) -> None:
        """What the load said about the model (a setting it ignored, a drafter it could not use), once, after any
        message up: the notices reached the CLI only, the app dropped them."""
        state = self.models.state(key)
        notices = (state.info or {}).get("notices") if state is not None else None
        if not notices:
            return
        said = " ".join(notices)
        if state.name not in said and state.own_name not in said:
            said = self.tr("%1: %2").replace("%1", state.entry.name).replace("%2", said)
        bar = self.statusBar()
        # in place of the load's own "Imported …" or "… loaded" (the bar is one line), after any other message
        ours = (self.tr("Imported %1").replace("%1", state.entry.name), self.tr("%1 loaded").replace("%1", state.name))
        before = "" if bar.currentMessage() in ours else bar.currentMessage()
        bar.showMessage(" · ".join(filter(None, (before, said))), NOTICE_MS)
        print(f"parley: {said}", file=sys.stderr)  # as the start's notice: the bar's line may be cut short

    def _tell_draft_applies(self, key: str) -> None:
        """A drafter chosen (or dropped) drafts for models loaded from then on: the ones loaded keep theirs, which the
        Models dialog's "drafts for the others" did not say."""
        loaded = [s.entry.name for k, s in self.models.states.items() if s.status == "loaded" and k != key]
        if not loaded:
            return
        entry, dflash = self.models.registry.get(key) if key else None, self.models.dflash_file()
        drafter = Path(dflash).name if dflash else entry.name if entry is not None else ""
        now = (self.tr("%1 drafts for models loaded from now on").replace("%1", drafter) if drafter else
               self.tr("Models loaded from now on draft from their prompts"))
        keep = self.tr("keeps") if len(loaded) == 1 else self.tr("keep")
        self.statusBar().showMessage(self.tr("%1; %2 %3 drafting as before until loaded again (Models: Unload, Load).")
                                     .replace("%1", now).replace("%2", ", ".join(loaded)).replace("%3", keep), NOTICE_MS)

    # -- look
    def set_theme(self, mode: str) -> None:
        """The View menu's choice: the saved theme, and this launch's from now on (over a --theme flag)."""
        self.app_settings.theme, self.app_settings.launch_theme = mode, None
        self._show_theme()

    def _show_theme(self) -> None:
        mode = self.app_settings.shown_theme
        self.dark = apply_theme(QApplication.instance(), mode)
        for view in [self.chat.view] + [c.view for c in self.compare.columns]:
            view.set_dark(self.dark)
        for action in self._theme_actions.actions():
            action.setChecked(action.data() == mode)

    def _on_color_scheme(self, _scheme: Qt.ColorScheme) -> None:
        """The desktop went light or dark (at sunset, say): a window set to follow it follows it now."""
        if self.app_settings.shown_theme == "system":
            self._show_theme()

    def _on_app_font(self, _font) -> None:
        """The desktop's text size changed: the style is chosen again, so icons grow with a larger font (theme.fusion_for)."""
        self._show_theme()

    def _save_theme(self, mode: str) -> None:
        self.set_theme(mode)
        self._save_settings()

    def _save_one_at_a_time(self, on: bool) -> None:
        self.app_settings.one_at_a_time = on
        self._save_settings()

    def closeEvent(self, event) -> None:
        self._forget_trash()  # first: a deleted chat's draft goes with it
        self._drop_untouched(keep=self.current())  # not kept for the next start: nothing of the user's is in them
        self._save_geometry()
        super().closeEvent(event)

    def _save_geometry(self) -> None:
        """Window size and place, the sidebar's width, the open chat and every chat's draft, into settings.json."""
        self.app_settings.window = {"geometry": bytes(self.saveGeometry().toBase64()).decode("ascii"),
                                    "sidebar": self.splitter.sizes()[0]}
        if self.current() is not None:
            self.app_settings.window["chat"] = self.current()
        self._save_drafts()

    def _save_drafts(self) -> None:
        self._draft_timer.stop()
        self.app_settings.drafts = self.service.drafts()  # unsent text comes back with the app
        self.app_settings.edits = self.service.edits()  # and an edit in progress as the edit
        self._save_settings()

    def _save_settings(self) -> None:
        """Writes settings.json; the first failure in a row says so (a theme or preset change silently lost on a full
        disk or a read-only folder), the next save that works says nothing."""
        failed_before = bool(self.app_settings.save_error)
        if self.app_settings.save() or not self.app_settings.save_error or failed_before:
            return
        self.statusBar().showMessage(self.tr("Settings not saved: %1 (%2)").replace(
            "%1", str(self.app_settings.file)).replace("%2", self.app_settings.save_error), 15000)

    def _restore_geometry(self) -> None:
        """Size and place as the user left them, if that still fits a screen (Qt moves it onto one); a first launch's
        FIRST_SIZE, or the screen's room where that is less."""
        saved = self.app_settings.window
        if saved.get("geometry"):
            self.restoreGeometry(QByteArray.fromBase64(saved["geometry"].encode("ascii")))
        elif self.screen() is not None:
            title = self.style().pixelMetric(QStyle.PixelMetric.PM_TitleBarHeight)  # the frame is unknown until shown
            frame = QMargins(BORDER_GUESS, title, BORDER_GUESS, BORDER_GUESS)
            place = first_geometry(self.screen().availableGeometry(), FIRST_SIZE, frame)
            if place is not None:
                self.setGeometry(place)
        if isinstance(saved.get("sidebar"), int) and saved["sidebar"] > 0:
            self.splitter.setSizes([saved["sidebar"], max(1, self.width() - saved["sidebar"])])

    def _on_conversations(self) -> None:
        gone = self.current() is not None and (not self.service.store.has(self.current()) or self.service.trashed(self.current()))
        if gone:
            # the list may lag (a refresh waits for a rename to end): only chats still there
            ids = [i for i in self.sidebar.ids() if self.service.store.has(i) and not self.service.trashed(i)]
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
        """Every command is a menu action; its shortcuts are the action's, so menus show them."""
        self.shortcuts: dict[str, QAction] = {}
        bar = self.menuBar()
        file = bar.addMenu(self.tr("&File"))
        self._action(file, self.tr("New chat"), self.start_chat, ["Ctrl+N"], "new")
        self._action(file, self.tr("Import GGUF file…"), self.import_file, [], "import")
        self._action(file, self.tr("Import Hugging Face folder…"), self.import_folder, [], "import")
        file.addSeparator()
        self._action(file, self.tr("Quit"), self.close, [QKeySequence(QKeySequence.StandardKey.Quit).toString() or "Ctrl+Q"])
        chat = bar.addMenu(self.tr("&Chat"))
        self._action(chat, self.tr("Settings…"), self.edit_settings, ["Ctrl+,"], "settings")
        self._action(chat, self.tr("Stop"), self.stop, ["Ctrl+."], "stop")
        self._action(chat, self.tr("Write a message"), self.focus_composer, ["Ctrl+L"])
        chat.addSeparator()
        self._action(chat, self.tr("Next chat"), lambda: self.step_chat(1), ["Ctrl+Tab", "Ctrl+PgDown"])
        self._action(chat, self.tr("Previous chat"), lambda: self.step_chat(-1), ["Ctrl+Shift+Tab", "Ctrl+PgUp"])
        chat.addSeparator()
        self._action(chat, self.tr("Delete chat"), self.delete_current, [], "delete")
        self._action(chat, self.tr("Undo delete"), self.undo_delete, ["Ctrl+Shift+Z"])
        view = bar.addMenu(self.tr("&View"))
        self._action(view, self.tr("Compare models"), self.show_compare, ["Ctrl+K"], "compare")
        self._action(view, self.tr("Models…"), self.show_models, ["Ctrl+Shift+M"])
        self._action(view, self.tr("Recent messages…"), lambda: self.messages.show_dialog(self), [])
        live = self.live_panel.toggleViewAction()
        live.setText(self.tr("Live generations"))
        live.setShortcut(QKeySequence("Ctrl+Shift+L"))
        live.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        view.addAction(live)
        self.addAction(live)
        self.shortcuts["Ctrl+Shift+L"] = live
        themes = view.addMenu(self.tr("Theme"))
        self._theme_actions = QActionGroup(self)
        for mode, label in zip(THEMES, (self.tr("System"), self.tr("Light"), self.tr("Dark"))):
            action = QAction(label, self, checkable=True, data=mode)
            action.triggered.connect(lambda _c=False, m=mode: self._save_theme(m))
            self._theme_actions.addAction(action)
            themes.addAction(action)
        help_menu = bar.addMenu(self.tr("&Help"))
        self._action(help_menu, self.tr("About Parley"), lambda: show_about(self, self.models), [])

    def _action(self, menu, text: str, fn, keys: list[str], icon_name: str | None = None) -> QAction:
        action = QAction(icon(icon_name) if icon_name else QIcon(), text, self)
        action.setShortcuts([QKeySequence(k) for k in keys])
        action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)  # also from a compare column or a dialog-less popup
        action.triggered.connect(lambda _checked=False: fn())
        menu.addAction(action)
        self.addAction(action)  # shortcuts work with the menu bar hidden too
        for key in keys:
            self.shortcuts[key] = action
        return action

    # -- keys no widget took: Esc stops (or cancels an edit) wherever the focus is
    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Escape and not event.modifiers():
            self.escape()
            return
        super().keyPressEvent(event)

    def escape(self) -> None:
        page = self.compare if self.stack.currentWidget() is self.compare else self.chat
        if page.composer.banner.isVisible():
            page.composer.cancel_edit()
        else:
            self.stop()


def first_geometry(available: QRect, wanted: QSize, frame: QMargins) -> QRect | None:
    """A first window on a screen without room for `wanted` in its `frame`: the room there is, its frame centred on
    the screen (a 1200×780 window ran off a 1024×600 screen). None where `wanted` fits: the window system places it."""
    room = available.marginsRemoved(frame)
    if wanted.width() <= room.width() and wanted.height() <= room.height():
        return None
    size = wanted.boundedTo(room.size())
    outer = QRect(0, 0, size.width(), size.height()).marginsAdded(frame)
    outer.moveCenter(available.center())
    return outer.marginsRemoved(frame)
