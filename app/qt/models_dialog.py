"""The model list: every model Parley knows, with what it is (architecture, quantization, context, sizes) and
whether it is loaded; load one, import one, or take an imported one off the list."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QMessageBox, QPushButton, QTreeWidget,
    QTreeWidgetItem, QVBoxLayout,
)

from app.core.model_registry import ModelEntry
from app.qt.model_manager import DFLASH_KEY, ModelManager
from engine.loading.gguf_split import model_files

KEY_ROLE = Qt.ItemDataRole.UserRole
COLUMNS = ("Model", "Status", "Architecture", "Quantization", "Context per chat", "File", "In memory")
CONTEXT_COLUMN = COLUMNS.index("Context per chat")
MAX_COLUMN_CHARS = 28  # a long quantization summary is elided (its cell's tooltip is not needed: About has it)


class ModelsDialog(QDialog):
    import_requested = Signal()
    removed = Signal(str)  # a key taken off the list: pickers reload

    def __init__(self, models: ModelManager, parent=None):
        super().__init__(parent)
        self.models = models
        self.setWindowTitle(self.tr("Models"))
        self.table = QTreeWidget(rootIsDecorated=False, uniformRowHeights=True)
        self.table.setHeaderLabels([self.tr(c) for c in COLUMNS])
        self.table.headerItem().setToolTip(CONTEXT_COLUMN, self._context_tip())
        self.table.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.header().setStretchLastSection(False)  # the model's name takes the slack, not "In memory"
        self.table.setAccessibleName(self.tr("Models"))
        self.load_button = QPushButton(self.tr("Load"))
        self.unload_button = QPushButton(self.tr("Unload"))
        self.unload_button.setToolTip(self.tr("Frees the model's memory; a chat using it loads it again when it next answers"))
        self.remove_button = QPushButton(self.tr("Remove from list"))
        self.remove_button.setToolTip(self.tr("Takes an imported model off the list (the file stays where it is)"))
        self.import_button = QPushButton(self.tr("Import…"))
        self.draft_button = QPushButton(self.tr("Draft with it"))
        self.draft_button.setToolTip(self.tr(
            "Speculative decoding: this smaller model proposes tokens that the model you chat with checks in one step "
            "(the same answers, often faster). Needs the same tokenizer; applies to models loaded from now on"))
        self.dflash_button = QPushButton()
        self.dflash_button.setToolTip(self.tr(
            "Speculative decoding with a DFlash drafter: a small network trained for one model (python -m "
            "training.dflash) proposes a block of tokens from that model's own hidden states; the same answers, "
            "faster when it guesses well. Applies to models loaded from now on"))
        self.dflash_label = QLabel()
        buttons = QHBoxLayout()
        for b in (self.load_button, self.unload_button, self.draft_button, self.dflash_button, self.remove_button,
                  self.import_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.dflash_label)
        layout.addLayout(buttons)
        layout.addWidget(close)
        self.load_button.clicked.connect(lambda: self._selected() and self.models.ensure(self._selected()))
        self.unload_button.clicked.connect(lambda: self._selected() and self.models.unload(self._selected()))
        self.remove_button.clicked.connect(self._remove)
        self.draft_button.clicked.connect(self._toggle_draft)
        self.dflash_button.clicked.connect(self._toggle_dflash)
        self.import_button.clicked.connect(self.import_requested)
        self.table.currentItemChanged.connect(lambda *_: self._enable())
        # bound methods, not lambdas: Qt drops the connections when the dialog is deleted on close
        models.changed.connect(self._on_model_changed)
        models.imported.connect(self._on_model_changed)
        models.draft_changed.connect(self._on_model_changed)
        models.context_known.connect(self._on_model_changed)
        self.refresh()
        line = self.fontMetrics().height()
        need = self._columns_width() + 24 * self.fontMetrics().averageCharWidth()  # the name 24 characters wide
        # 860 px where the screen has them: an 800 px screen showed its right edge (Close) off it
        self.resize(min(max(860, need), max(need, self.screen().availableGeometry().width())), max(320, 14 * line))

    def _on_model_changed(self, _key: str) -> None:
        # a load's progress changes no cell: rebuilding the table at each of its ~240 steps (the embedded model's split
        # copy) stalled the window up to 0.4-0.5 s while the dialog was open
        if self._shown() != self._listing():
            self.refresh()
        else:
            self._enable()  # the buttons: a DFlash drafter chosen changes no row

    def entries(self) -> list[ModelEntry]:
        """The registry's models, then those being imported (a row at once: "checking…", then "loading")."""
        return [*self.models.registry.entries(), *self.models.importing()]

    def rows(self) -> list[list[str]]:
        return [self._row(entry) for entry in self.entries()]

    def _listing(self) -> list[tuple[str, list[str], str]]:
        """What the table shows: each model's key, cells and its status's tooltip (why it failed; else the status)."""
        listing = []
        for entry, cells in zip(self.entries(), self.rows()):
            state = self.models.state(entry.key)
            failed = state is not None and state.status == "failed"
            listing.append((entry.key, cells, state.message if failed else cells[1]))
        return listing

    def _shown(self) -> list[tuple[str, list[str], str]]:
        items = map(self.table.topLevelItem, range(self.table.topLevelItemCount()))
        return [(item.data(0, KEY_ROLE), [item.text(col) for col in range(len(COLUMNS))], item.toolTip(1))
                for item in items]

    def refresh(self) -> None:
        selected = self._selected()
        self.table.clear()
        paths = {entry.key: entry.path for entry in self.entries()}
        for key, cells, status_tip in self._listing():
            item = QTreeWidgetItem(cells)
            item.setData(0, KEY_ROLE, key)
            item.setToolTip(0, paths[key])
            item.setToolTip(1, status_tip)
            for col in (4, 5, 6):
                item.setTextAlignment(col, Qt.AlignmentFlag.AlignRight)
            self.table.addTopLevelItem(item)
            if key == selected:
                self.table.setCurrentItem(item)
        self._fit_columns()
        self._enable()

    def _fit_columns(self) -> None:
        """Each column after the name as wide as its header or widest cell, up to a cap (a large font cut the
        headers to "Archite", "Contex" while "In memory" took the slack)."""
        cap = MAX_COLUMN_CHARS * self.table.fontMetrics().averageCharWidth()
        for col in range(1, len(COLUMNS)):
            self.table.resizeColumnToContents(col)
            if col != 1:  # the status, which says what drafts for what, is read whole
                self.table.setColumnWidth(col, min(cap, self.table.columnWidth(col)))

    def _columns_width(self) -> int:
        return sum(self.table.columnWidth(col) for col in range(1, len(COLUMNS)))

    def _row(self, entry: ModelEntry) -> list[str]:
        state = self.models.state(entry.key)
        info = (state.info or {}) if state is not None else {}
        status = {None: self.tr("not loaded"), "loading": self.tr("loading"), "loaded": self.tr("loaded"),
                  "failed": self.tr("failed")}[state.status if state is not None else None]
        if state is not None and state.status == "loading" and state.model_id is None and state.stage == "Checking":
            status = self.tr("checking…")  # an import's headers read off the GUI thread, before its load
        if state is None and entry.kind != "embedded" and not Path(entry.path).exists():
            status = self.tr("file not found")  # moved or deleted since it was imported: Load would fail
        status += "".join(" · " + said for said in self._drafting(entry.key, state))
        context = self._context(info.get("context"), state.own_context if state is not None else None)
        memory = size_text(info["weights_mb"] * 1e6) if info.get("weights_mb") else "—"
        return [entry.name, status, str(info.get("architecture") or "—"), str(info.get("quantization") or "—"),
                context, _file_size(self.models.file_of(entry.key)), memory]

    def _context(self, per_chat: int | None, own: int | None) -> str:
        """What a chat holds of the model's own context, "4,096 of 32,768": a bare "4,096" (Parley's cap) read as the
        model's own beside a small model's "2,048"."""
        if not per_chat:
            return "—"
        return self.tr("%1 of %2").replace("%1", f"{per_chat:,}").replace("%2", f"{own:,}") if own else f"{per_chat:,}"

    def _context_tip(self) -> str:
        config = self.models.bridge.engine.config
        cap = self.tr(" Parley keeps room for %1 chats answering at once, so a chat holds up to %2 tokens.").replace(
            "%1", str(config.max_sessions)).replace("%2", f"{config.max_session_tokens:,}") \
            if config.max_session_tokens else ""
        return self.tr("The tokens one chat holds (its messages and the answer), of the context length the model was "
                       "made for.") + cap

    def _drafting(self, key: str, state) -> list[str]:
        """Which model drafts for which: 'drafts for the others' named neither them nor that the loaded ones keep the
        drafter they loaded with (a choice applies to models loaded from then on)."""
        said = []
        if state is not None and state.status == "loaded" and state.drafter and (state.info or {}).get(
                "speculative") in ("draft", "dflash"):
            said.append(self.tr("drafted by %1").replace("%1", self._drafter_name(state.drafter)))
        if key == self.models.draft_key:
            served = [s.entry.name for s in self.models.states.values() if s.status == "loaded" and s.drafter == key
                      and (s.info or {}).get("speculative") == "draft"]
            said.append(self.tr("drafts for %1 and for models loaded from now on").replace("%1", ", ".join(served))
                        if served else self.tr("drafts for models loaded from now on"))
        return said

    def _drafter_name(self, draft_key: str) -> str:
        if draft_key.startswith(DFLASH_KEY):
            return self.tr("the DFlash drafter %1").replace("%1", Path(draft_key[len(DFLASH_KEY):]).name)
        entry = self.models.registry.get(draft_key)
        return entry.name if entry is not None else draft_key

    def _selected(self) -> str | None:
        item = self.table.currentItem()
        return item.data(0, KEY_ROLE) if item is not None else None

    def _enable(self) -> None:
        key = self._selected()
        entry = self.models.registry.get(key) if key is not None else None
        self.load_button.setEnabled(entry is not None and self.models.model_id(key) is None)
        self.unload_button.setEnabled(entry is not None and self.models.model_id(key) is not None)
        self.remove_button.setEnabled(entry is not None and entry.kind != "embedded")
        self.draft_button.setEnabled(entry is not None)
        drafting = key is not None and key == self.models.draft_key
        self.draft_button.setText(self.tr("Stop drafting with it") if drafting else self.tr("Draft with it"))
        dflash = self.models.dflash_file()
        self.dflash_button.setText(self.tr("Stop DFlash drafting") if dflash else self.tr("DFlash drafter…"))
        self.dflash_label.setText(self.tr("Drafting with the DFlash drafter {0}").format(Path(dflash).name)
                                  if dflash else "")
        self.dflash_label.setVisible(bool(dflash))

    def _toggle_dflash(self) -> None:
        if self.models.dflash_file():
            self.models.use_dflash(None)
            return
        path, _ = QFileDialog.getOpenFileName(self, self.tr("DFlash drafter"), "",
                                              self.tr("DFlash drafters (*.safetensors)"))
        if path:
            self.choose_dflash(path)

    def choose_dflash(self, path: str) -> bool:
        """Drafts with the drafter at `path`; a file that is not one is refused with a message."""
        if self.models.use_dflash(path):
            return True
        QMessageBox.warning(self, self.tr("DFlash drafter"), self.tr(
            "{0} is not a DFlash drafter (a .safetensors file written by python -m training.dflash).").format(
            Path(path).name))
        return False

    def _toggle_draft(self) -> None:
        key = self._selected()
        if key is not None:
            self.models.use_as_draft(None if key == self.models.draft_key else key)

    def _remove(self) -> None:
        key = self._selected()
        if key is not None and self.models.registry.get(key) is not None:
            self.models.unload(key)  # while its chats still name it: those waiting for it to load end, none hangs
            if key == self.models.draft_key:  # models loaded from now on must not draft with one off the list
                self.models.use_as_draft(None)
            self.models.registry.remove(key)
            self.refresh()
            self.removed.emit(key)


def _file_size(path: str | None) -> str:
    """Bytes on disk of a GGUF file (every part of a split one) or a Hugging Face folder's files."""
    if not path:
        return "—"
    try:
        total = sum(f.stat().st_size for f in model_files(Path(path)))
    except OSError:
        return "—"
    return size_text(total)


def size_text(n: float) -> str:
    """Bytes as MB, or GB from a thousand MB on ("4.9 GB", not "4,943 MB"); one decimal under 10 MB (not "0 MB")."""
    if n >= 1e9:
        return f"{n / 1e9:,.1f} GB"
    return f"{n / 1e6:.1f} MB" if n < 1e7 else f"{n / 1e6:,.0f} MB"
