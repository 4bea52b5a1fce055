"""The sidebar's list of chats as a model: a new list is applied as the rows inserted, removed, moved or changed, so a
change costs Qt calls in proportion to what changed, not to the number of chats (a QListWidget's rows were walked on
each change: 10-17 ms for 3,000 chats, 85-165 ms for 20,000)."""
from __future__ import annotations

from typing import NamedTuple

from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtGui import QIcon, QStandardItemModel
from PySide6.QtWidgets import QLineEdit, QStyledItemDelegate

CONV_ROLE = Qt.ItemDataRole.UserRole
MAX_EDITS = 64  # more edits than this (a search's results, scattered rows): the changed span is replaced at once


Row = tuple[int, str, bool, bool]  # (conversation, title, pinned, busy): 20,000 made in 1 ms (as NamedTuples: 5 ms)


def mark(row: Row) -> str:
    """The icon a row shows: busy (answering or waiting to) over pinned."""
    return "busy" if row[3] else "pin" if row[2] else ""


class Edit(NamedTuple):
    """Rows `first`..`last` removed or inserted (`kind`), or row `first` moved to before row `last` ("move", in the
    numbering before the move, as beginMoveRows counts), each in the numbering the edits before it left."""
    kind: str
    first: int
    last: int


def edits(old: list[int], new: list[int], most: int = MAX_EDITS) -> list[Edit]:
    """Edits that turn the ids `old` into `new` (each id once in a list): rows gone, one row moved, rows added; past
    `most` edits, or with more than one row moved, the span between the rows that stay in place is replaced."""
    start = _common_prefix(old, new)
    end = _common_prefix(old[start:][::-1], new[start:][::-1])  # the common tail, within what follows the prefix
    a, b = old[start:len(old) - end], new[start:len(new) - end]
    replaced = [e for e in (Edit("remove", start, start + len(a) - 1), Edit("insert", start, start + len(b) - 1))
                if e.last >= e.first]
    in_a, in_b = set(a), set(b)
    removed = _runs([i for i, x in enumerate(a) if x not in in_b], most)
    inserted = _runs([i for i, x in enumerate(b) if x not in in_a], most)
    if removed is None or inserted is None or len(removed) + len(inserted) > most:
        return replaced
    kept_a, kept_b = [x for x in a if x in in_b], [x for x in b if x in in_a]
    moved = [] if kept_a == kept_b else _one_move(kept_a, kept_b)
    if kept_a != kept_b and not moved:
        return replaced
    return ([Edit("remove", start + first, start + last) for first, last in reversed(removed)]
            + [Edit("move", start + row, start + before) for row, before in moved]
            + [Edit("insert", start + first, start + last) for first, last in inserted])


def _common_prefix(a: list, b: list, step: int = 256) -> int:
    """How many items `a` and `b` begin with alike; compared a slice at a time (in C), then item by item."""
    n, i = min(len(a), len(b)), 0
    while i < n and a[i:i + step] == b[i:i + step]:
        i += step
    return next((k for k in range(i, min(i + step, n)) if a[k] != b[k]), n)


def _runs(rows: list[int], most: int) -> list[tuple[int, int]] | None:
    """Increasing row numbers as (first, last) of each run of consecutive ones; None past `most` runs."""
    if rows and rows[-1] - rows[0] == len(rows) - 1:
        return [(rows[0], rows[-1])]
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row - 1:
            runs[-1] = (runs[-1][0], row)
        elif len(runs) == most:
            return None
        else:
            runs.append((row, row))
    return runs


def _one_move(a: list[int], b: list[int]) -> list[tuple[int, int]]:
    """[(row, before)] when `b` is `a` with one row moved (a chat up on its reply, down when unpinned), else []."""
    start = _common_prefix(a, b)
    end = _common_prefix(a[start:][::-1], b[start:][::-1])
    a, b = a[start:len(a) - end], b[start:len(b) - end]
    if a[1:] == b[:-1]:
        return [(start, start + len(a))]  # the first row went down
    if a[:-1] == b[1:]:
        return [(start + len(a) - 1, start)]  # the last row came up
    return []


class ChatListModel(QStandardItemModel):
    """Its rows are counted in C++ (they hold no items): a view lays out every row at each change, asking for each
    row's index twice, which a QAbstractListModel checks against a Python rowCount: 30-50 ms for 20,000 chats. What the
    rows show is Python's, read for those on screen. (QStringListModel puts rows in one at a time: 70 ms for 18,000.)"""

    renamed = Signal(int, str)  # conversation, the title typed in its row

    def __init__(self, icons: dict[str, QIcon], parent=None):
        super().__init__(0, 1, parent)
        self._icons = icons
        self._rows: list[Row] = []
        self._ids: list[int] = []  # the rows' conversations
        self._next: list[Row] | None = None  # the rows an edit under way leaves, taken as the views hear it is done
        self._index: dict[int, int] | None = None  # conversation -> row, made again once the rows changed
        for done in (self.rowsInserted, self.rowsRemoved):
            done.connect(self._edited)  # connected before any view: it reads the rows the edit left

    def rows(self) -> list[Row]:
        return self._rows

    def row_of(self, conv_id: int) -> int | None:
        if self._index is None:
            self._index = dict(zip(self._ids, range(len(self._ids))))
        return self._index.get(conv_id)

    def show(self, rows: list[Row]) -> bool:
        """The list becomes `rows`; whether anything changed."""
        if rows == self._rows:
            return False
        old_ids, new_ids = self._ids, [r[0] for r in rows]
        if old_ids != new_ids:
            for edit in edits(old_ids, new_ids):
                self._apply(edit, rows, new_ids)
            self._ids, self._index = new_ids, None
        first = _common_prefix(self._rows, rows)  # the rows kept, some of them changed (a title, a mark)
        last = len(rows) - 1 - _common_prefix(self._rows[::-1], rows[::-1])
        self._rows = rows
        if first <= last:  # one signal for the span: the view repaints what it shows of it
            self.dataChanged.emit(self.index(first, 0), self.index(last, 0))
        return True

    def set_marks(self, conv_id: int, pinned: bool, busy: bool) -> None:
        row = self.row_of(conv_id)
        if row is None or self._rows[row][2:] == (pinned, busy):
            return
        self._rows[row] = (*self._rows[row][:2], pinned, busy)
        self.dataChanged.emit(self.index(row, 0), self.index(row, 0))

    def _apply(self, edit: Edit, rows: list[Row], ids: list[int]) -> None:
        """One edit to the rows shown; a row inserted or moved is taken from `rows`, the list all the edits lead to
        (`ids`: theirs)."""
        kind, first, last = edit
        old = self._rows
        if kind == "remove":
            self._next = old[:first] + old[last + 1:]
            self.removeRows(first, last - first + 1)
        elif kind == "insert":
            self._next = old[:first] + rows[first:last + 1] + old[first:]
            self.insertRows(first, last - first + 1)
        else:  # a move (which this model lacks) as the row taken out and put back
            row = rows[ids.index(old[first][0])]  # as it is now (pinned, say)
            self._apply(Edit("remove", first, first), rows, ids)
            at = last - (last > first)
            self._next = self._rows[:at] + [row] + self._rows[at:]
            self.insertRows(at, 1)

    def _edited(self, *_args) -> None:
        if self._next is not None:
            self._rows, self._next = self._next, None

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsEditable

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or index.row() >= len(self._rows):
            return None
        row = self._rows[index.row()]
        conv_id, title, pinned, busy = row
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole, Qt.ItemDataRole.ToolTipRole):
            return title
        if role == Qt.ItemDataRole.DecorationRole:
            return self._icons.get(mark(row))  # an icon, not an emoji: that is a box without an emoji font
        if role == Qt.ItemDataRole.AccessibleTextRole:
            notes = [self.tr("answering") if busy else "", self.tr("pinned") if pinned else ""]
            return ", ".join([title, *filter(None, notes)])
        if role == CONV_ROLE:
            return conv_id
        return None

    def setData(self, index: QModelIndex, value, role: int = Qt.ItemDataRole.EditRole) -> bool:
        """A title typed in the row goes to whoever renames the chat; the row shows the title that comes back."""
        if role != Qt.ItemDataRole.EditRole or not index.isValid() or index.row() >= len(self._rows):
            return False
        self.renamed.emit(self._rows[index.row()][0], str(value))
        return True


class TitleDelegate(QStyledItemDelegate):
    """A title being typed stays as typed: the view sets an open editor back to its row's data whenever the row
    changes (its chat starting to answer), which threw the typing away."""

    def setEditorData(self, editor, index: QModelIndex) -> None:
        if not (isinstance(editor, QLineEdit) and editor.isModified()):
            super().setEditorData(editor, index)
