"""A growing table's chunks (app/core/growing_block.py) in a document: drawn as the one table while they grow, joined
into it once it is complete.

Qt sizes a table's columns from all of its cells (each column's widest word and widest line, then the width there is),
so chunks laid out alone would each take their own widths. Each row's cells are measured once, as Qt laid them out in
the document; the rows holding each column's widest word and widest line make a small table that Qt lays out at the
document's width, and its column widths, fixed on every chunk, are the whole table's. They are worked out again only
where a column's widest cell or the width changes (then every chunk is laid out again, as the one table would be).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtGui import QTextCursor, QTextDocument, QTextDocumentFragment, QTextLength, QTextTable

from app.core.growing_block import table_rows

Widest = tuple[tuple[float, str], ...]  # per column: the widest measure of its cells and the row (HTML) holding it


@dataclass(slots=True)
class ChunkWidths:
    """The column widths a document's growing table's chunks share, and what they were worked out from."""

    rows: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict)  # last chunk's, measured
    chunks: dict[str, tuple[Widest, Widest]] = field(default_factory=dict)  # the chunks before it: their widest
    basis: tuple | None = None
    widths: list[QTextLength] = field(default_factory=list)

    def align(self, doc: QTextDocument, tables: list[QTextTable], chunks: list[str]) -> None:
        """Gives `tables`, the document's chunks `chunks` (their HTML), the column widths of the one table they make."""
        doc.size()  # laid out (the view asks for its size next): its cells' measures are read from their layouts
        widest = []
        for k, (chunk, table) in enumerate(zip(chunks, tables)):
            last = k == len(chunks) - 1
            found = None if last else self.chunks.get(chunk)
            widest.append(found or self._widest(doc, table, table_rows(chunk), 1 if k == 0 else 0, last))
            if widest[-1] is None:
                return
        least = tuple(max(column) for column in zip(*(w[0] for w in widest)))
        most = tuple(max(column) for column in zip(*(w[1] for w in widest)))
        basis = (tuple(w for w, _ in least), tuple(w for w, _ in most), doc.textWidth(), doc.documentMargin())
        if basis != self.basis:
            witnesses = "".join(dict.fromkeys(row for _, row in least + most))
            self.widths = _probe_widths(doc, table_rows(chunks[0])[0] + "<tbody>\n" + witnesses)
            self.basis = basis
        self.chunks = dict(zip(chunks[:-1], widest[:-1]))
        cursor = QTextCursor(doc)
        cursor.beginEditBlock()  # the chunks laid out once
        for table in tables:
            if table.format().columnWidthConstraints() != self.widths:
                fmt = table.format()
                fmt.setColumnWidthConstraints(self.widths)
                table.setFormat(fmt)
                # a table of one empty cell is not laid out again for its format alone
                doc.markContentsDirty(table.firstPosition() - 1, table.lastPosition() - table.firstPosition() + 2)
        cursor.endEditBlock()

    def _widest(self, doc: QTextDocument, table: QTextTable, parsed: tuple[str, list[str], str] | None, head: int,
                last: bool) -> tuple[Widest, Widest] | None:
        """Per column, the widest word and the widest line of a chunk's body rows (table_rows), a row measured once."""
        rows = parsed[1] if parsed is not None else []
        if not rows or table.rows() != head + len(rows):
            return None
        measured = {row: self.rows.get(row) or _measure(doc, table, head + r) for r, row in enumerate(rows)}
        if last:
            self.rows = measured
        columns = range(table.columns())
        return (tuple(max((measured[row][0][c], row) for row in rows) for c in columns),
                tuple(max((measured[row][1][c], row) for row in rows) for c in columns))


def _measure(doc: QTextDocument, table: QTextTable, row: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per cell of a row: its widest word and its width on one line, as Qt sized them (a monotone measure of what Qt
    sizes its column by: the cell with the widest of them is the one that sizes the column)."""
    layouts = [doc.findBlock(table.cellAt(row, c).firstPosition()).layout() for c in range(table.columns())]
    return tuple(layout.minimumWidth() for layout in layouts), tuple(layout.maximumWidth() for layout in layouts)


def _probe_widths(doc: QTextDocument, html: str) -> list[QTextLength]:
    """The column widths Qt gives a table of `html`'s rows (its header and the rows that size its columns) in a
    document as `doc` lays it out."""
    probe = type(doc)()  # a SafeDocument, which loads no resources
    probe.setDefaultFont(doc.defaultFont())
    probe.setDefaultStyleSheet(doc.defaultStyleSheet())
    probe.setDefaultTextOption(doc.defaultTextOption())
    probe.setDocumentMargin(doc.documentMargin())
    probe.setTextWidth(doc.textWidth())
    probe.setHtml(html + "</tbody>\n</table>\n")
    table = next(frame for frame in probe.rootFrame().childFrames() if isinstance(frame, QTextTable))
    probe.size()
    padding = 2 * table.format().cellPadding()  # a line of a cell is its column's width but for the cell's padding
    return [QTextLength(QTextLength.Type.FixedLength,
                        probe.findBlock(table.cellAt(0, c).firstPosition()).layout().lineAt(0).width() + padding)
            for c in range(table.columns())]


def join_tables(doc: QTextDocument, tables: list[QTextTable]) -> None:
    """The chunks `tables` one table: the rows of those after the first moved into it, its widths Qt's again and its
    bottom margin the last's."""
    first, block = tables[0], doc.findBlock(tables[-1].lastPosition() + 1)  # the block after the last, kept
    formats = block.blockFormat(), block.charFormat()
    fmt = first.format()
    fmt.setBottomMargin(tables[-1].format().bottomMargin())
    fmt.clearColumnWidthConstraints()
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    for table in tables[1:]:
        put_rows(first, first.rows(), 0, table, 0)
    cursor.setPosition(first.lastPosition() + 1)
    cursor.setPosition(tables[-1].lastPosition() + 1, QTextCursor.MoveMode.KeepAnchor)
    cursor.removeSelectedText()
    if cursor.blockFormat() != formats[0]:
        cursor.setBlockFormat(formats[0])
    if cursor.blockCharFormat() != formats[1]:
        cursor.setBlockCharFormat(formats[1])
    first.setFormat(fmt)
    cursor.endEditBlock()


def put_rows(table: QTextTable, at: int, dropped: int, source: QTextTable, start: int) -> None:
    """`table`'s rows from `at` on (`dropped` of them) taken out and `source`'s rows from `start` on put after them,
    each cell with its format, its block's formats and its text (as setHtml of the whole reads them)."""
    added, end = source.rows() - start, table.rows()
    if added > 0:
        table.appendRows(added)  # before the rows go: a table left without rows would be taken out of the document
    parsed, columns = source.document(), source.columns()
    text = QTextCursor(parsed)
    for row in range(max(0, added)):
        for column in range(columns):
            cell, into = source.cellAt(start + row, column), table.cellAt(end + row, column)
            into.setFormat(cell.format())
            block = parsed.findBlock(cell.firstPosition())
            cursor = into.firstCursorPosition()
            cursor.setBlockFormat(block.blockFormat())
            cursor.setBlockCharFormat(block.charFormat())
            text.setPosition(cell.firstPosition())
            text.setPosition(cell.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
            cursor.insertFragment(QTextDocumentFragment(text))
    if dropped:
        table.removeRows(at, dropped)
