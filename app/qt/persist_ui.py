"""The GUI side of persistence: a flush timer, the store's warning in the status bar, export/import menu actions."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QFileDialog, QLabel, QMainWindow, QMenu

from app.core import export
from app.core.atomic_file import write_text_whole
from app.core.chats import ChatService
from engine.errors import ParleyError

FLUSH_MS = 1000  # streamed text reaches the disk at least this often, even when tokens stall
FILTERS = "Markdown (*.md);;JSON — full history with branches (*.json)"


class PersistenceUI(QObject):
    def __init__(self, window: QMainWindow, service: ChatService, parent: QObject | None = None):
        super().__init__(parent or window)
        self.window, self.service, self.store = window, service, service.store
        self.timer = QTimer(self, interval=FLUSH_MS)
        self.timer.timeout.connect(self.flush)
        self.timer.start()
        self.warning = QLabel(objectName="storeWarning")
        self.warning.setStyleSheet("color: #d33")
        self.warning.hide()
        window.statusBar().addPermanentWidget(self.warning)
        if hasattr(self.store, "on_warning"):
            self.store.on_warning = self.show_warning
            if self.store.warning:
                self.show_warning(self.store.warning)
        if getattr(self.store, "notice", ""):  # changes held back at the last quit, merged in now
            window.statusBar().showMessage(self.store.notice, 15000)
        self._menu()

    def flush(self) -> None:
        if hasattr(self.store, "flush"):
            self.store.flush()

    def show_warning(self, text: str) -> None:
        if not text:  # the store writes again (another program let go of its lock)
            if self.warning.isVisible():
                self.warning.hide()
                self.window.statusBar().showMessage("Chats are saved again.", 5000)
            return
        # a damaged database set aside and a new one started still saves: only a store in memory does not
        saving = getattr(self.store, "persistent", False) and not getattr(self.store, "locked_out", False)
        self.warning.setText("⚠ Chat database replaced" if saving else "⚠ Not saving chats")
        self.warning.setToolTip(text)
        self.warning.show()
        self.window.statusBar().showMessage(text, 15000)

    def _menu(self) -> None:
        file_menu = next((a.menu() for a in self.window.menuBar().actions() if a.text() == "&File"), None)
        menu = QMenu("Export / import chats", self.window)
        menu.addAction("Export this chat…", self.export_current)
        menu.addAction("Export all chats…", self.export_all)
        menu.addAction("Import chats…", self.import_dialog)
        if file_menu is None:
            self.window.menuBar().addMenu(menu)
            return
        quit_action = file_menu.actions()[-1]
        file_menu.insertMenu(quit_action, menu)
        file_menu.insertSeparator(quit_action)
        self.menu = menu

    # -- actions (the *_to / import_from forms are what tests call)
    def export_current(self) -> None:
        conv_id = getattr(self.window, "current", lambda: None)()
        if conv_id is not None:
            self._export_dialog([conv_id], self.store.get(conv_id).title)

    def export_all(self) -> None:
        self._export_dialog(None, "Parley chats")

    def _export_dialog(self, ids: list[int] | None, name: str) -> None:
        safe = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in name)[:60] or "chat"
        path, chosen = QFileDialog.getSaveFileName(self.window, "Export chats", f"{safe}.md", FILTERS)
        if path:
            self.export_to(path, ids, "json" if "json" in chosen.lower() or path.endswith(".json") else "md")

    def export_to(self, path: str | Path, ids: list[int] | None, fmt: str) -> bool:
        self.flush()
        text = export.export_json(self.store, ids) if fmt == "json" else export.export_markdown(self.store, ids)
        try:
            write_text_whole(Path(path), text)  # a full disk keeps the last export whole, not a cut-off new one
        except OSError as exc:
            self._warn("Export failed", f"{path}\n\n{exc.strerror or exc}")
            return False
        self.window.statusBar().showMessage(f"Exported to {path}", 5000)
        return True

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Import chats", "", "Parley exports (*.json *.md)")
        if path:
            self.import_from(path)

    def import_from(self, path: str | Path) -> list[int]:
        try:
            ids = export.import_file(self.store, path)
        except (ParleyError, OSError) as exc:
            self._warn("Import failed", f"{path}\n\n{exc}")
            return []
        self.service.conversations_changed.emit()
        self.window.statusBar().showMessage(f"Imported {len(ids)} chat(s)", 5000)
        return ids

    def _warn(self, title: str, text: str) -> None:
        warn = getattr(self.window, "_warn", None)
        if warn is not None:
            warn(title, text)
        else:
            self.window.statusBar().showMessage(f"{title}: {text}", 15000)
