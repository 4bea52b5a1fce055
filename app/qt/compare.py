"""Compare view: one prompt box sending to 2–4 columns, each with its own model/settings and its own history.

Columns fit any window: side by side when there is room, 2×2 when four do not fit in a row, else one row that
scrolls sideways; the window itself never grows. The columns are a compare group in the store, so they come
back after a restart with their settings and history.
"""
from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import QEvent, QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QAbstractItemView, QApplication, QFileDialog, QFrame, QGridLayout, QHBoxLayout, QLabel, QMenu, QScrollArea,
    QSpinBox, QToolButton, QVBoxLayout, QWidget,
)

from app.core.atomic_file import write_text_whole
from app.core.chats import ChatService
from app.core.comparison import column_labels, comparison_markdown, group_title, has_messages, left_behind
from app.core.presets import Presets
from app.core.reasoning import reply_text
from app.qt.compare_column import COLUMN_MIN_WIDTH, CompareColumn
from app.qt.compare_diff import DiffDialog
from app.qt.composer import Composer, LinkNote
from app.qt.elided_label import IconWhenNarrow
from app.qt.model_manager import ModelManager
from app.qt.theme import icon

MAX_COLUMNS = 4
MIN_COLUMNS = 2
COLUMN_MIN_HEIGHT = 260  # a tile of the 2×2 layout
SYNC_SETTLE_MS = 60


class CompareView(QWidget):
    promoted = Signal(int)  # the conversation that became a normal chat

    def __init__(self, service: ChatService, models: ModelManager, one_at_a_time: bool = False, parent=None,
                 presets: Presets | None = None):
        super().__init__(parent)
        self.service, self.models, self.presets = service, models, presets
        self.columns: list[CompareColumn] = []
        self.group_id: int | None = None
        self._queue: list[tuple[CompareColumn, str]] = []  # one-at-a-time mode: columns still to answer
        self.count = QSpinBox(minimum=MIN_COLUMNS, maximum=MAX_COLUMNS, value=MIN_COLUMNS, prefix=self.tr("Columns: "))
        self.count.setAccessibleName(self.tr("Number of columns"))
        # toggles live in the Comparisons menu: the bar stays narrow enough for any window
        self.one_at_a_time = QAction(self.tr("One column at a time"), self, checkable=True, checked=one_at_a_time)
        self.one_at_a_time.setToolTip(self.tr("Columns answer in turn instead of together (for small machines)"))
        self.sync = QAction(self.tr("Sync scrolling"), self, checkable=True, checked=True)
        self.sync.setToolTip(self.tr("Scrolling one column shows the same turn in the others"))
        # its icon alone where the bar is short of room: with its text, the Live panel beside made an 800 px window 862
        self.clear_button = IconWhenNarrow(icon=icon("new"), text=self.tr("New comparison"))
        self.clear_button.setToolTip(self.tr("Start over with empty columns; this comparison stays in Comparisons"))
        self.more = QToolButton(text=self.tr("Comparisons"), popupMode=QToolButton.ToolButtonPopupMode.InstantPopup)
        self.more.setMenu(QMenu(self.more))
        self.more.menu().aboutToShow.connect(self._fill_menu)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("<b>" + self.tr("Compare") + "</b>"))
        bar.addStretch(1)
        for w in (self.count, self.clear_button, self.more):
            bar.addWidget(w)
        self.grid_host = QWidget(objectName="compareColumns")
        self.grid = QGridLayout(self.grid_host)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self.scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # a Tab stop with no name; a focused column scrolls into view
        self.scroll.setWidget(self.grid_host)
        self.scroll.viewport().installEventFilter(self)
        self.composer = Composer(self.tr("One prompt for every column — Enter sends"))
        self.composer.edit.setAccessibleName(self.tr("Prompt for every column"))
        self.queued = LinkNote(objectName="queuedNote")  # "Back to the box" by mouse or keyboard
        self.queued.hide()
        self.queued.linkActivated.connect(self._on_note_link)
        self._next: list[str] = []  # prompts sent while the columns answered: each goes when they are all done
        self.editing: int | None = None  # the turn whose prompt the box holds for editing (0: the first)
        self._syncing = False
        layout = QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(self.scroll, 1)
        layout.addWidget(self.queued)
        layout.addWidget(self.composer)
        self.layout_mode = "row"  # row, tiles (2×2), stack (one above the other) or scroll (a row wider than the view)
        self.count.valueChanged.connect(self.set_columns)
        self.clear_button.clicked.connect(self.clear)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop)
        self.composer.edit_cancelled.connect(self._end_edit)
        self.composer.edit.textChanged.connect(self._keep_draft)
        service.turn_done.connect(self._on_turn_done)
        service.status_changed.connect(self._on_status)
        service.settings_changed.connect(self._on_settings)
        models.changed.connect(self._relabel)  # bound: it stops with the view, a lambda would not
        self._prune_orphans()
        self._restore()

    # -- columns
    def ensure_columns(self) -> None:
        """The first time the view is used: two columns with the default settings. The columns' models load."""
        if not self.columns:
            self.set_columns(MIN_COLUMNS)
        self._warm()

    def _warm(self) -> None:
        """Starts loading the columns' models while the user types (as a chat on screen does)."""
        for column in self.columns:
            self.models.ensure(self.service.store.get(column.conv_id).settings.model)

    def set_columns(self, n: int) -> None:
        n = max(MIN_COLUMNS, min(MAX_COLUMNS, n))
        while len(self.columns) < n:
            self._add_column(self.service.new_conversation(self.service.defaults, hidden=True))
        while len(self.columns) > n:
            self._remove_column(self.columns.pop())
        self._save_group()
        self._arrange()
        self._relabel()
        if self.count.value() != n:
            self.count.blockSignals(True)
            self.count.setValue(n)
            self.count.blockSignals(False)

    def _add_column(self, conv_id: int) -> CompareColumn:
        column = CompareColumn(self.service, self.models, conv_id, presets=self.presets)
        column.promote_requested.connect(self.promote)
        column.close_requested.connect(self.close_column)
        column.view.edit_requested.connect(lambda msg_id, c=column: self.begin_edit(c, msg_id))
        bar = column.view.verticalScrollBar()
        bar.actionTriggered.connect(lambda _action, c=column: QTimer.singleShot(0, self, lambda: self._sync_from(c)))
        self.columns.append(column)
        return column

    def close_column(self, column: CompareColumn) -> None:
        """One column taken away, whichever it is (its Close button); the others keep their settings and answers."""
        if column in self.columns and len(self.columns) > MIN_COLUMNS:
            self.columns.remove(column)
            self._remove_column(column)
            self.set_columns(len(self.columns))

    def _remove_column(self, column: CompareColumn) -> None:
        """A column taken away: an empty one goes; one with answers becomes a chat, so nothing is lost."""
        self._queue = [(c, text) for c, text in self._queue if c is not column]  # its turn would go to a gone chat
        self.grid.removeWidget(column)  # out of its cell now: the next column moves into it before this one is deleted
        column.hide()
        column.view.set_conversation(None)
        column.deleteLater()
        if not self.service.store.path(column.conv_id):
            self.service.delete(column.conv_id)
            return
        self.service.stop(column.conv_id)
        self.service.promote(column.conv_id, touch=False)
        self.queued.setText(self.tr("Column %1 had answers: it is now a chat in the sidebar.").replace("%1", column.letter))
        self.queued.show()

    def _drop_columns(self) -> None:
        """Takes the column widgets away; their conversations stay (another comparison is opened)."""
        if self.editing is not None:  # a prompt of the comparison that goes
            self.composer.cancel_edit()
        for column in self.columns:
            column.view.set_conversation(None)
            column.deleteLater()
        self.columns = []

    def _save_group(self) -> None:
        ids = [c.conv_id for c in self.columns]
        if self.group_id is None:
            self.group_id = self.service.store.add_compare_group(ids)
        else:
            self.service.store.set_compare_members(self.group_id, ids)

    def saved_groups(self) -> dict[int, list[int]]:
        """The comparisons in the store whose columns are all still there (promoted columns leave theirs)."""
        store = self.service.store
        return {g: m for g, m in store.compare_groups().items() if all(store.has(c) and store.get(c).hidden for c in m)}

    def _restore(self) -> None:
        """The latest comparison, as it was left: its columns, their settings and history."""
        groups = self.saved_groups()
        if groups:
            self.open_group(max(groups))

    def open_group(self, group_id: int) -> None:
        """Shows a saved comparison; the one on screen stays saved if it has any message, else it goes."""
        members = self.saved_groups().get(group_id)
        if not members or group_id == self.group_id:
            return
        self.stop()
        self._discard_if_empty()
        self._drop_columns()
        self.group_id = group_id
        for conv_id in members[:MAX_COLUMNS]:
            self._add_column(conv_id)
        self.set_columns(len(self.columns))  # a comparison left with one column gets its second back
        if draft := self.service.draft(self.columns[0].conv_id):  # else the box keeps what it holds: the empty
            self.composer.edit.setPlainText(draft)  # comparison left goes, and the text typed in it went with it
        if self.isVisible():  # restored at start behind the chat page: its models load when it is shown
            self._warm()
        self._offer_catch_up()

    def _offer_catch_up(self) -> None:
        """Columns left without the last prompt (closed while they waited their turn) are offered it, not sent it:
        the user may rather send something else, and a start should not begin answering by itself."""
        behind, text = left_behind(self.service.store, [c.conv_id for c in self.columns])
        if not behind or self._next:
            return
        letters = ", ".join(c.letter for c in self.columns if c.conv_id in behind)
        first = html.escape(" ".join(text.split())[:80])
        self.queued.setText(self.tr("Not answered yet in column %1: “%2”. <a href=\"catch-up:\">Answer it now</a>")
                            .replace("%1", letters).replace("%2", first))
        self.queued.show()

    def catch_up(self) -> None:
        """The columns left behind get the prompt the others answered (in turn, in one-at-a-time mode)."""
        self.queued.hide()
        behind, text = left_behind(self.service.store, [c.conv_id for c in self.columns])
        columns = [c for c in self.columns if c.conv_id in behind]
        if not columns or self.busy():
            return
        self._send_to(columns, text)

    def _discard_if_empty(self) -> None:
        ids = [c.conv_id for c in self.columns]
        if self.group_id is not None and ids and not has_messages(self.service.store, ids):
            self.service.store.delete_compare_group(self.group_id)
            for conv_id in ids:
                self.service.delete(conv_id)

    def _prune_orphans(self) -> None:
        """Hidden chats in no comparison (older versions made two per start and saved no comparison): the
        empty ones go; those with messages become chats in the sidebar, so nothing written is out of reach."""
        store = self.service.store
        grouped = {c for members in store.compare_groups().values() for c in members}
        for conv in store.conversations(include_hidden=True):
            if not conv.hidden or conv.id in grouped:
                continue
            if store.children(conv.id, None):
                self.service.promote(conv.id, touch=False)
            else:
                self.service.delete(conv.id)

    # -- layout: never wider than the window
    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt's name
        # the viewport's own resize: at the view's, the viewport still had its old width, and a window made narrower
        # kept a row of columns wider than it, the last cut off without a scroll bar
        if watched is self.scroll.viewport() and event.type() == QEvent.Type.Resize:
            self._arrange()
        return super().eventFilter(watched, event)

    def _arrange(self) -> None:
        n = len(self.columns)
        if n == 0:
            return
        width = self.scroll.viewport().width()
        height = self.scroll.viewport().height()
        fit = max(1, width // COLUMN_MIN_WIDTH)
        if fit >= n:
            mode, per_row = "row", n
        elif n == 4 and fit >= 2 and height >= 2 * COLUMN_MIN_HEIGHT:
            mode, per_row = "tiles", 2
        elif fit == 1 and self.scroll.height() >= n * COLUMN_MIN_HEIGHT:  # the area's height: a scroll bar may go
            # one above the other: beside the Live panel an 800 px window had room for one column and a half, and
            # the second was behind a sideways scroll bar
            mode, per_row = "stack", 1
        else:
            mode, per_row = "scroll", n
        self.layout_mode = mode
        for i, column in enumerate(self.columns):
            self.grid.addWidget(column, i // per_row, i % per_row)
            column.close_button.setVisible(n > MIN_COLUMNS)  # two at the least
        for c in range(MAX_COLUMNS):
            self.grid.setColumnStretch(c, 1 if c < per_row else 0)
        for r in range(MAX_COLUMNS):
            self.grid.setRowStretch(r, 1 if r < (n + per_row - 1) // per_row else 0)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded if mode == "scroll"
                                                 else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

    def scroll_to(self, column: CompareColumn) -> None:
        self.scroll.ensureWidgetVisible(column, 0, 0)

    def column_in_focus(self) -> CompareColumn | None:
        """The column holding the keyboard focus (or the one last clicked), else the first."""
        focus = QApplication.focusWidget()
        for column in self.columns:
            if focus is not None and column.isAncestorOf(focus):
                return column
        return self.columns[0] if self.columns else None

    def edit_settings(self) -> None:
        column = self.column_in_focus()
        if column is not None:
            column.edit_settings()

    # -- labels: "B: qwen3 · T 0.2"
    def _relabel(self, *_key: str) -> None:
        if not self.columns or not all(self.service.store.has(c.conv_id) for c in self.columns):
            return
        names = [c.model_name() for c in self.columns]
        labels = column_labels(self.service.store, [c.conv_id for c in self.columns], names)
        for i, (column, label, name) in enumerate(zip(self.columns, labels, names)):
            column.set_letter(chr(ord("A") + i))
            if not self.service.busy(column.conv_id):  # a model picked mid-answer is the next answer's: so is its name
                column.set_label(label, name_end=len(f"{column.letter}: {name}"))

    def labels(self) -> list[str]:
        ids = [c.conv_id for c in self.columns]
        return column_labels(self.service.store, ids, [c.model_name() for c in self.columns])

    def _on_settings(self, conv_id: int) -> None:
        if any(c.conv_id == conv_id for c in self.columns):
            self._relabel()

    # -- turns
    def busy(self) -> bool:
        return bool(self._queue) or any(self.service.busy(c.conv_id) for c in self.columns)

    def send(self, text: str) -> bool:
        """The prompt (or follow-up) goes to every column; while they answer it waits, shown above the box."""
        self.ensure_columns()
        if not text.strip():
            return False
        self.composer.edit.clear()
        for column in self.columns:
            column.view.follow()  # the answers start on screen, however far up the synced columns were scrolled
        if self.editing is not None:
            return self._send_edit(text)
        if self.busy():
            self._next.append(text.strip())
            self._show_queued()
            return True
        self.queued.hide()  # an offer to catch up columns left behind (the prompt queued shows again when it waits)
        self._send_to(self.columns, text)
        return True

    def _send_to(self, columns: list[CompareColumn], text: str) -> None:
        if self.one_at_a_time.isChecked():
            self._queue = [(c, text) for c in columns[1:]]
            self.service.send(columns[0].conv_id, text)
        else:
            for column in columns:
                self.service.send(column.conv_id, text)
        self._on_status(self.columns[0].conv_id)

    # -- editing an earlier prompt: every column that has that turn branches from it with the new text
    def begin_edit(self, column: CompareColumn, msg_id: int) -> None:
        """A column's Edit: the prompt goes into the box, and sending it makes a new branch in every column."""
        prompts = [m.id for m in self.service.store.path(column.conv_id) if m.role == "user"]
        if msg_id not in prompts:
            return
        self.editing = prompts.index(msg_id)
        self.composer.begin_edit(self.service.store.message(msg_id).content)
        self.composer.banner.setText(self.tr("Editing prompt %1: sending makes a new branch in every column (the old "
                                             "ones stay). Esc cancels.").replace("%1", str(self.editing + 1)))

    def _send_edit(self, text: str) -> bool:
        turn = self.editing
        self._end_edit()
        self.composer.end_edit()
        for column in self.columns:
            prompts = [m for m in self.service.store.path(column.conv_id) if m.role == "user"]
            if len(prompts) > turn:  # a column added since has no such turn
                self.service.edit(prompts[turn].id, text)
        self._on_status(self.columns[0].conv_id)
        return True

    def _end_edit(self) -> None:
        """The box back to the comparison's draft, as the edit found it."""
        self.editing = None
        if self.columns:
            self.composer.edit.setPlainText(self.service.draft(self.columns[0].conv_id))

    def stop(self) -> None:
        self._queue.clear()
        self.unqueue()
        for column in self.columns:
            self.service.stop(column.conv_id)

    def unqueue(self) -> None:
        """Waiting prompts go back into the box."""
        if not self._next:
            return
        text = "\n\n".join([*self._next, self.composer.edit.toPlainText()]).strip()
        self._next.clear()
        self.composer.edit.setPlainText(text)
        self._show_queued()

    def _keep_draft(self) -> None:
        """The box's text and the prompts waiting, kept as the first column's draft: they come back with the
        comparison after a restart (they were lost), as a chat's unsent text does."""
        if self.columns and self.editing is None:
            text = "\n\n".join([*self._next, self.composer.edit.toPlainText()]).strip()
            self.service.set_draft(self.columns[0].conv_id, text)

    def _show_queued(self) -> None:
        self._keep_draft()
        if self._next:
            first = html.escape(" ".join(self._next[0].split())[:80])
            self.queued.setText(self.tr("Queued: “%1” — goes to every column when they have all answered. "
                                        "<a href=\"unqueue:\">Back to the box</a>").replace("%1", first))
        self.queued.setVisible(bool(self._next))

    def clear(self) -> None:
        """Fresh, empty columns with the same settings; the comparison left stays in Comparisons."""
        self.stop()
        settings = [self.service.store.get(c.conv_id).settings for c in self.columns]
        if not has_messages(self.service.store, [c.conv_id for c in self.columns]):
            return
        self.service.set_draft(self.columns[0].conv_id, "")  # the box's text goes on with the new comparison
        self._drop_columns()
        self.group_id = None
        for s in settings:
            self._add_column(self.service.new_conversation(s, hidden=True))
        self._save_group()
        self._arrange()
        self._relabel()
        self._keep_draft()

    # -- the Comparisons menu: saved comparisons, export, diff
    def _fill_menu(self) -> None:
        menu = self.more.menu()
        menu.clear()
        store = self.service.store
        for gid, members in sorted(self.saved_groups().items(), reverse=True):
            if gid != self.group_id and has_messages(store, members):
                action = menu.addAction(group_title(store, members), lambda g=gid: self.open_group(g))
                action.setToolTip(self.tr("%n column(s)", "", len(members)))
        if menu.actions():
            menu.addSeparator()
        menu.addAction(self.tr("Compare two answers…"), self.show_diff)
        menu.addAction(self.tr("Export as Markdown…"), self.export_dialog)
        menu.addSeparator()
        menu.addAction(self.sync)
        menu.addAction(self.one_at_a_time)

    def export_markdown(self) -> str:
        return comparison_markdown(self.service.store, [c.conv_id for c in self.columns], self.labels())

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, self.tr("Export comparison"), "comparison.md", "Markdown (*.md)")
        if path:
            try:
                write_text_whole(Path(path), self.export_markdown())  # a failed write keeps the old file whole
            except OSError as exc:
                self.queued.setText(self.tr("Export failed: %1").replace("%1", html.escape(str(exc))))
                self.queued.show()

    def show_diff(self) -> DiffDialog:
        dialog = DiffDialog(self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        self.diff_dialog = dialog
        return dialog

    def last_answer(self, column: CompareColumn) -> str:
        """The column's last reply, without a thinking model's thought (what the differences compare)."""
        path = self.service.store.path(column.conv_id)
        answers = [m for m in path if m.role == "assistant"]
        return reply_text(answers[-1].content) if answers else ""

    # -- synced scrolling: the turn at the top of the column scrolled is put at the top of the others
    def _sync_from(self, source: CompareColumn, again: bool = True) -> None:
        if self._syncing or not self.sync.isChecked() or source not in self.columns:
            return
        if again:  # rows scrolled into view get their real heights a moment later: align once more then
            # `self`: not called once the view is gone (a closed window's timer failed the next test's setup)
            QTimer.singleShot(SYNC_SETTLE_MS, self, lambda: self._sync_from(source, again=False))
        top = source.view.indexAt(QPoint(4, 4))
        if not top.isValid():
            return
        self._syncing = True
        try:
            for column in self.columns:
                model = column.view.model()
                if column is not source and top.row() < model.rowCount():
                    column.view.scrollTo(model.index(top.row(), 0), QAbstractItemView.ScrollHint.PositionAtTop)
        finally:
            self._syncing = False

    def promote(self, column: CompareColumn) -> None:
        conv_id = column.conv_id
        settings = self.service.store.get(conv_id).settings
        # a turn it still waited for would go to the empty chat the column starts again with
        self._queue = [(c, text) for c, text in self._queue if c is not column]
        self.service.promote(conv_id)
        column.attach(self.service.new_conversation(settings, hidden=True))
        self._save_group()
        self.service.set_draft(conv_id, "")  # the comparison's text is not the new chat's
        self._keep_draft()
        self.promoted.emit(conv_id)

    def _on_turn_done(self, conv_id: int, _msg_id: int) -> None:
        if not any(c.conv_id == conv_id for c in self.columns):
            return
        self._relabel()  # a model picked while it answered names the column from now on
        if any(self.service.busy(c.conv_id) for c in self.columns):
            return
        if not self.models.bridge.engine.running:  # the app closing ended the turn: the next column's would be saved as
            return  # 'The engine has shut down; restart Parley to continue.', still there after the restart
        if self._queue:
            column, text = self._queue.pop(0)
            self.service.send(column.conv_id, text)
        elif not self._tell_too_long() and self._next:
            QTimer.singleShot(0, self._send_next)  # after every column has taken this turn's end

    def _tell_too_long(self) -> bool:
        """Columns that refused the prompt for its length (every column has had it): one line each above the box.
        Refused by all, it leaves them and comes back into the box, as a chat's does; else it stays in those columns
        with their error (the others answered it). False when none refused."""
        refused = [(c, why) for c in self.columns if (why := self.service.too_long(c.conv_id))]
        if not refused:
            return False
        self.unqueue()  # as a chat's refusal does: what waited comes back to the box, nothing goes unseen
        lines = [self.tr("%1: %2").replace("%1", c.letter).replace("%2", html.escape(why)) for c, why in refused]
        if len(refused) == len(self.columns):
            texts = [self.service.take_back(c.conv_id) for c in self.columns]
            box = self.composer.edit.toPlainText()
            self.composer.edit.setPlainText("\n\n".join(filter(None, [next(filter(None, texts), ""), box])))
            head = self.tr("<b>Not sent:</b> too long for every column; the prompt is back in the box.")
        else:
            for column, _why in refused:
                self.service.keep_refused(column.conv_id)
            which = ", ".join(c.letter for c, _ in refused)
            head = (self.tr("<b>Not answered in column %1:</b> the prompt is too long there. ") if len(refused) == 1 else
                    self.tr("<b>Not answered in columns %1:</b> the prompt is too long there. ")).replace("%1", which)
            head += self.tr("Edit it to shorten it in every column, or pick another model there and Retry.")
        shown = [head, *lines] if len(refused) == len(self.columns) else [head]  # else each column's error says why
        self.queued.setText("<br>".join(shown) + ' <a href="dismiss:">' + self.tr("Dismiss") + "</a>")
        self.queued.show()
        return True

    def _on_note_link(self, href: str) -> None:
        if href == "catch-up:":
            self.catch_up()
        elif href == "dismiss:":
            self.queued.hide()
        else:
            self.unqueue()

    def _send_next(self) -> None:
        if self._next and not self.busy():
            self.send(self._next.pop(0))
            self._show_queued()

    def _on_status(self, conv_id: int) -> None:
        if any(c.conv_id == conv_id for c in self.columns):
            self.composer.set_busy(self.busy())
