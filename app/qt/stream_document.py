"""The document of a streaming message, edited in place: each update replaces only the parts that changed.

A message's HTML comes in parts (header, thought, one per Markdown block with the cursor and note after the last).
Rebuilding the whole QTextDocument on every token cost setHtml and a full layout of all of it (a 100,000-character
answer: ~400 ms a frame on a 2-core Xeon); here the groups of parts before the first changed one stay, and Qt lays out
only what was inserted. Parts are inserted alone only after a text block or a table: Qt's HTML import keeps or drops
an empty block before a table, next to a rule or an empty element depending on what came before, so such parts go in
with their neighbours, joined as setHtml would read them. A group before the last takes new parts in place where they
can stand alone there (a header whose links change when the answer ends, a long code block highlighted only then).
A growing table comes in chunks of rows (app/core/growing_block.py): they take the one table's column widths while it
grows and become that table when it is complete (app/qt/table_chunks.py).
"""
from __future__ import annotations

import re
import time
import weakref
from dataclasses import dataclass, field

from PySide6.QtCore import QUrl
from PySide6.QtGui import (QTextBlock, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument,
                           QTextDocumentFragment, QTextFormat, QTextList, QTextTable)

from app.core.growing_block import chunk_run, chunk_tables, join_chunks, table_rows
from app.qt.table_chunks import ChunkWidths, join_tables, put_rows

FRAME_START, FRAME_END = "\ufdd0", "\ufdd1"  # the characters that open and close a table in a document's text
SPLIT_TRIES = 8  # boundaries an empty document tries, from its end, to find one where the parts after go in alone
EMPTY_ITEM = "<li></li>\n"  # an empty list item, which Qt's HTML import leaves out
LIST_TAG = re.compile(r"<(/?)(ul|ol|li)[ >]")  # a model's own tags are escaped: these are the renderer's
LISTS_BACK = 3  # lists a growing part's last list may be put in again after (a note's one-item list between two)
SLICE_CHARS = 6_000  # HTML a document catching up takes at a time: ~5-15 ms of parsing and layout on a 2-core Xeon


class SafeDocument(QTextDocument):
    """A document that loads no resources: an image or style sheet URL is never read from disk or anywhere. The
    StreamDocument that owns it hears of a new text width (the view sets it after an update and when it is resized)."""

    width_changed: weakref.WeakMethod | None = None

    def loadResource(self, kind: int, name: QUrl):  # noqa: N802 (Qt's name)
        return None

    def setTextWidth(self, width: float) -> None:  # noqa: N802 (Qt's name)
        changed = width != self.textWidth()
        super().setTextWidth(width)
        heard = self.width_changed() if changed and self.width_changed is not None else None
        if heard is not None:
            heard()


@dataclass(slots=True)
class _Group:
    """Parts inserted as one piece of HTML, and how to take them out again."""

    position: int  # where its text begins (the document's end before it went in)
    block: QTextBlockFormat  # the formats of the block there before, put back when it is cut
    char: QTextCharFormat
    parts: list[str] = field(default_factory=list)
    open_end: bool = False  # it ends in an empty block (a rule, an empty element): the next joins it
    end: bool = False  # the document's last parts: read as they end (a newline after the last tag is a space)


class StreamDocument:
    """Owns `doc`; `update(parts)` brings it to setHtml("".join(parts))'s blocks and formats."""

    def __init__(self, doc: QTextDocument):
        self.doc = doc
        doc.setUndoRedoEnabled(False)  # each token's edit would stay in the undo stack for the whole answer
        self._groups: list[_Group] = []
        self._complete = True
        self._widths = ChunkWidths()  # of a growing table's chunks
        if isinstance(doc, SafeDocument):  # its chunks take the table's widths at the new width at once
            doc.width_changed = weakref.WeakMethod(self._align_chunks)

    @property
    def parts(self) -> list[str]:
        return [part for group in self._groups for part in group.parts]

    @property
    def complete(self) -> bool:
        """Whether the document reads as all the parts of the last update (a budget may have left some for later)."""
        return self._complete

    def update(self, parts: list[str], budget: float | None = None) -> bool:
        """Brings the document to `parts`. With a `budget` (seconds) it stops once that is spent, between slices of
        about SLICE_CHARS of HTML, and the next update goes on from there; returns whether all of them are in."""
        deadline = None if budget is None else time.perf_counter() + budget
        self._join_chunks(parts)
        same = 0
        for index, group in enumerate(self._groups):
            new = parts[same:same + len(group.parts)]
            inner = index < len(self._groups) - 1 and len(new) == len(group.parts)
            end = same + len(new) == len(parts)
            changed = new != group.parts or group.end != end
            if changed and not inner and (self._grow_table(group, new, end) or self._grow_list(group, new, end)):
                same += len(new)
                continue
            if changed and not (inner and self._replace(index, new)):
                self._cut(index)
                break
            same += len(group.parts)
        if not self._groups:
            same = self._start(parts, SLICE_CHARS if budget is not None else None)
        taken = 0
        while same < len(parts) and (deadline is None or not taken or time.perf_counter() < deadline):
            taken += 1  # a slice at least, whatever the time, so that each call goes on
            count = _slice(parts, same) if budget is not None else 1
            self._append(parts[same:same + count], end=same + count == len(parts))
            same += count
        self._complete = same == len(parts)
        self._align_chunks()
        return self._complete

    def _join_chunks(self, parts: list[str]) -> None:
        """The chunks of a table that grew at the document's end made one table in place where `parts` have it whole (it
        ended): put in again, all of its HTML was parsed and laid out. The group of the first takes the rest's parts."""
        old = self.parts
        run = chunk_run(old)
        at = len(old) - run
        # where the parts there are still chunks (a document catching up has the first few of them), they stay
        new = table_rows(parts[at]) if run and at < len(parts) and not chunk_run(parts[at:at + 2]) else None
        if new is None:
            return
        joined = join_chunks(chunk_tables(old[at:]))
        tables = self._tables()[-run:]
        if new[0] != table_rows(joined)[0] or len(tables) != run:
            return
        join_tables(self.doc, tables)
        count, index = 0, 0
        while count + len(self._groups[index].parts) <= at:
            count += len(self._groups[index].parts)
            index += 1
        group, last = self._groups[index], self._groups[-1]
        group.parts = group.parts[:at - count] + [joined + old[-1][len(chunk_tables(old[-1:])[0]):]]
        group.end, group.open_end = last.end, last.open_end
        del self._groups[index + 1:]
        self._widths = ChunkWidths()

    def _align_chunks(self) -> None:
        """A growing table's chunks drawn as the one table: its column widths on each, once the document has a width
        (the view gives it one after filling it, and a new one when resized: SafeDocument tells)."""
        parts = self.parts
        run = chunk_run(parts) if self.doc.textWidth() > 0 else 0
        tables = self._tables()[-run:] if run else []
        if run and len(tables) == run:
            self._widths.align(self.doc, tables, chunk_tables(parts[-run:]))

    def _tables(self) -> list[QTextTable]:
        """The tables of the document's top level, in order (a code block, a quote and a data table each one)."""
        return [frame for frame in self.doc.rootFrame().childFrames() if isinstance(frame, QTextTable)]

    def _start(self, parts: list[str], limit: int | None) -> int:
        """An empty document takes all but its last few parts by one setHtml (part by part took ~2x as long), up to
        the last boundary where the parts after it can go in alone (the last before `limit` characters of HTML, if
        given); returns how many parts it took. Its first parts (the header, which changes when the answer ends) are
        a group apart where they can be."""
        last = len(parts) - 1 if limit is None else min(len(parts) - 1, _slice(parts, 0, limit))
        split = self._boundary(parts, range(last, max(0, last - SPLIT_TRIES), -1))
        if split is None:
            return 0
        self.doc.setHtml("".join(parts[:split]).rstrip())
        blank = SafeDocument()  # what is at the start of a document before anything goes in
        empty = QTextCursor(blank)
        self._groups.append(_Group(0, empty.blockFormat(), empty.blockCharFormat(), parts[:split],
                                   _ends_open(self.doc)))
        head = self._boundary(parts, range(1, min(split, SPLIT_TRIES)))
        if head is not None:  # the document reads as the head's own, a new block, then the rest: that is where it ends
            self._split_group(head, self._parse("".join(parts[:head])).characterCount() - 1)
        return split

    def _boundary(self, parts: list[str], candidates: range) -> int | None:
        """The first of `candidates` where the parts after it can go in alone, after those before it."""
        for split in candidates:
            before, after = self._parse(parts[split - 1]), self._parse(parts[split])
            if not (_ends_open(before) or _starts_apart(after) or _list_goes_on(before.lastBlock(), after.begin())):
                return split
        return None

    def _split_group(self, count: int, position: int) -> None:
        """The last group's first `count` parts, which end at `position`, a group of their own."""
        group = self._groups[-1]
        cursor = QTextCursor(self.doc)
        cursor.setPosition(position)
        rest = _Group(position, cursor.blockFormat(), cursor.blockCharFormat(), group.parts[count:], group.open_end)
        group.parts, group.open_end = group.parts[:count], False
        self._groups.append(rest)

    def _replace(self, index: int, parts: list[str]) -> bool:
        """A group before the last takes new parts in place, the groups after it kept; False where those parts could
        not stand alone there (then it and all after it go in again)."""
        group, after = self._groups[index], self._groups[index + 1]
        parsed = self._parse("".join(parts))
        previous, following = self.doc.findBlock(group.position), self.doc.findBlock(after.position).next()
        if _ends_open(parsed) or _list_goes_on(parsed.lastBlock(), following) or (
                index and (_starts_apart(parsed) or _list_goes_on(previous, parsed.begin()))):
            return False
        count = self.doc.characterCount()
        cursor = QTextCursor(self.doc)
        cursor.setPosition(group.position)
        cursor.setPosition(after.position, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        _set_formats(cursor, group.block, group.char)
        if not parsed.isEmpty():
            _insert(cursor, parsed)
        shift = self.doc.characterCount() - count
        for later in self._groups[index + 1:]:
            later.position += shift
        cursor.setPosition(after.position)
        group.parts, after.block, after.char = parts, cursor.blockFormat(), cursor.blockCharFormat()
        return True

    def _grow_table(self, group: _Group, parts: list[str], end: bool) -> bool:
        """The last group takes a table's new rows and what follows it in place, where only its last part changed and
        only in rows of its table or after it (a growing table, its cursor moving on or its note when the answer ends:
        putting all of a 200-row one in again took 40-120 ms here); False otherwise."""
        if not group.end or len(parts) != len(group.parts) or parts[:-1] != group.parts[:-1]:
            return False
        old, new = table_rows(group.parts[-1]), table_rows(parts[-1])
        if old is None or new is None or old[0] != new[0] or (old[2] != new[2] and not (
                _plain_after(old[2]) and _plain_after(new[2]))):
            return False
        tables = self._tables()
        head = int("<thead>" in old[0])  # a chunk after a table's first has no header
        if not tables or tables[-1].rows() != head + len(old[1]):
            return False
        kept = next((k for k, (a, b) in enumerate(zip(old[1], new[1])) if a != b), min(len(old[1]), len(new[1])))
        parsed = self._parse(old[0] + "<tbody>\n" + "".join(new[1][kept:]) + "</tbody>\n</table>\n" + new[2], end)
        source = next((frame for frame in parsed.rootFrame().childFrames() if isinstance(frame, QTextTable)), None)
        if source is None or source.rows() != head + len(new[1]) - kept or source.columns() != tables[-1].columns():
            return False
        edit = QTextCursor(self.doc)
        edit.beginEditBlock()  # the table laid out once, not after each of its cells' edits (~0.5 s a token at 200 rows)
        put_rows(tables[-1], head + kept, len(old[1]) - kept, source, head)
        if old[2] != new[2] or group.end != end:
            _put_from(self.doc, tables[-1].lastPosition() + 1, parsed, source.lastPosition() + 1)
        edit.endEditBlock()
        group.parts, group.end, group.open_end = parts, end, _ends_open(parsed)
        return True

    def _grow_list(self, group: _Group, parts: list[str], end: bool) -> bool:
        """The last group takes the changed and new top-level items of its last list and what follows them in place,
        where only its last part changed and only from that list's second item on (a growing list: all of a 300-item one
        put in again took ~25-50 ms a token here); False otherwise (its first item or its looseness changed: then all
        of it goes in again)."""
        if not group.end or len(parts) != len(group.parts) or parts[:-1] != group.parts[:-1]:
            return False
        # a new list's first item (a note under "10.", then "11."): from the last item of a list before it on, all of the
        # lists one after another of a 300-item list went in again (~24,800 characters of HTML) while those were written
        part, lists = group.parts[-1], _top_lists(group.parts[-1])[-LISTS_BACK:]
        shown = [any(part[a:b] != EMPTY_ITEM for a, b in zip(items, items[1:] + [closed]))  # else not in the document
                 for _, items, closed in lists]
        return any(shown[-back] and self._grow_from_list(group, parts, end, lists[-back], sum(shown[-back:]))
                   for back in range(1, len(lists) + 1))

    def _grow_from_list(self, group: _Group, parts: list[str], end: bool, at: tuple[int, list[int], int],
                        shown: int) -> bool:
        """_grow_list from the top-level list of the group's last part `at`, the `shown`-th of the document's from its
        end, what follows that list put in again."""
        found = _list_items(group.parts[-1], parts[-1], at)
        if found is None:
            return False
        before, old, new, after = found
        kept = next((k for k, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        # the last item goes in again with what follows it (where it ends is not known); Qt drops an empty one (a
        # number just written)
        shown_old, shown_new = len(old) - (old[-1] == EMPTY_ITEM), len(new) - (new[-1] == EMPTY_ITEM)
        kept = min(kept, shown_old - 1)
        top = _last_list(self.doc, shown)
        if kept < 1 or kept >= shown_new or top is None or top.count() != shown_old or (
                top.item(0).position() < group.position):
            return False
        # parsed after the item before them, which Qt's import spaces as a list's first (its top margin)
        parsed = self._parse(before[before.rindex("<"):] + "".join(new[kept - 1:]) + after, end)
        source = parsed.begin().textList()
        if source is None or source.count() != 1 + shown_new - kept:
            return False
        edit = QTextCursor(self.doc)
        edit.beginEditBlock()
        start = top.item(kept).position()
        _put_from(self.doc, start - 1, parsed, source.item(1).position() - 1)
        block = self.doc.findBlock(start)
        copied = block.textList()  # inserted, its items make a list of their own: they join the one in the document
        while block.isValid():
            if block.textList() == copied:
                top.add(block)
            block = block.next()
        edit.endEditBlock()
        group.parts, group.end, group.open_end = parts, end, _ends_open(parsed)
        return True

    def _cut(self, index: int) -> None:
        group = self._groups[index]
        cursor = QTextCursor(self.doc)
        cursor.setPosition(group.position)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        _set_formats(cursor, group.block, group.char)
        del self._groups[index:]

    def _append(self, parts: list[str], end: bool) -> None:
        """`parts` at the end, one group (with the last group where the first of them cannot go in alone)."""
        parsed = first = self._parse(parts[0], end and len(parts) == 1)
        table_after_table = _starts_with_table(first) and _after_table(self.doc.lastBlock())
        if self._groups and (self._groups[-1].open_end or (_starts_apart(first) and not table_after_table)
                             or _list_goes_on(self.doc.lastBlock(), first.begin())):
            parts = self._groups[-1].parts + parts
            self._cut(len(self._groups) - 1)
        if len(parts) > 1:
            parsed = self._parse("".join(parts), end)
        cursor = QTextCursor(self.doc)
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._groups.append(_Group(cursor.position(), cursor.blockFormat(), cursor.blockCharFormat(), parts,
                                   open_end=_ends_open(parsed), end=end))
        if not parsed.isEmpty():
            _insert(cursor, parsed)

    def _parse(self, html: str, end: bool = False) -> QTextDocument:
        parsed = SafeDocument()
        parsed.setDefaultFont(self.doc.defaultFont())
        parsed.setDefaultStyleSheet(self.doc.defaultStyleSheet())
        # alone, the newline after a part's last tag would end its last block in a space (joined, it falls between
        # tags); at the document's end it does, as in setHtml of the whole
        parsed.setHtml(html if end else html.rstrip())
        return parsed


def _set_formats(cursor: QTextCursor, block: QTextBlockFormat, char: QTextCharFormat) -> None:
    """The formats of the cursor's block, set only where they differ: setting them on the block Qt ends a table with
    lays all of the table out again, same or not (a 200-row table: ~32 ms a token of the paragraph after it)."""
    if cursor.blockFormat() != block:
        cursor.setBlockFormat(block)
    if cursor.blockCharFormat() != char:
        cursor.setBlockCharFormat(char)


def _plain_after(html: str) -> bool:
    """Whether what follows a table is nothing or starts with a paragraph (its cursor, its note): after a table that
    goes in alone, where a rule or a list may take the block Qt ends the table with."""
    return not html or html.startswith("<p")


def _put_from(doc: QTextDocument, position: int, source: QTextDocument, start: int) -> None:
    """`doc` from `position` on replaced by `source` from `start` on."""
    cursor = QTextCursor(doc)
    cursor.setPosition(position)
    cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
    cursor.removeSelectedText()
    text = QTextCursor(source)
    text.setPosition(start)
    text.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
    if text.hasSelection():
        cursor.insertFragment(QTextDocumentFragment(text))


def _list_items(old: str, new: str, where: tuple[int, list[int], int]) -> tuple[str, list[str], list[str], str] | None:
    """(the HTML before the first item of `old`'s top-level list `where` (_top_lists), that list's items in `old` and in
    `new`, what follows them in `new`) where `new` has that list at the same place and neither holds a table from
    there on."""
    opened, items, closed = where
    if "<table" in old[opened:]:
        return None
    at = next((entry for entry in _top_lists(new) if entry[0] == opened), None)
    if at is None or new[:items[0]] != old[:items[0]] or "<table" in new[opened:]:
        return None
    pieces = lambda part, starts, end: [part[x:y] for x, y in zip(starts, starts[1:] + [end])]  # noqa: E731
    return old[:items[0]], pieces(old, items, closed), pieces(new, at[1], at[2]), new[at[2]:]


def _top_lists(part: str) -> list[tuple[int, list[int], int]]:
    """Where each top-level list of a part's HTML opens, its items start and it closes."""
    lists, depth = [], 0
    for tag in LIST_TAG.finditer(part):
        closing, name = tag.group(1), tag.group(2)
        if name != "li":
            depth += -1 if closing else 1
            if depth == 1 and not closing:
                lists.append((tag.start(), [], -1))
            elif depth == 0 and closing and lists:
                lists[-1] = (*lists[-1][:2], tag.start())
        elif depth == 1 and not closing and lists:
            lists[-1][1].append(tag.start())
    return [entry for entry in lists if entry[1] and entry[2] >= 0]


def _last_list(doc: QTextDocument, back: int = 1) -> QTextList | None:
    """The document's `back`-th top-level list from its end (a nested one is indented further)."""
    block, found = doc.lastBlock(), []
    while block.isValid() and len(found) < back:
        if block.textList() is not None and block.textList().format().indent() == 1 and block.textList() not in found:
            found.append(block.textList())
        block = block.previous()
    return found[-1] if len(found) == back else None


def _slice(parts: list[str], start: int, limit: int = SLICE_CHARS) -> int:
    """How many parts from `start` make one slice: up to `limit` characters, at least one, and the last SPLIT_TRIES
    parts one at a time (the last grows, and a part that cannot go in alone goes in again with the group before it:
    a small one)."""
    count, size = 1, len(parts[start])
    while start + count < len(parts) - SPLIT_TRIES and size + len(parts[start + count]) <= limit:
        size += len(parts[start + count])
        count += 1
    return count


def _ends_open(doc: QTextDocument) -> bool:
    """Whether it ends in an empty block (a rule, an empty element): what follows goes in with it. The plain block Qt
    ends a table with is not one: whatever follows takes a new block after it, joined or not."""
    last = doc.lastBlock()
    return doc.isEmpty() or (last.length() == 1 and not _after_table(last))


def _after_table(block: QTextBlock) -> bool:
    """Whether `block` is the plain empty block Qt ends a table with: a table after it goes in alone, in that very
    block, as setHtml reads two tables in a row (a code block's runs of lines)."""
    return (block.length() == 1 and block.document().characterAt(block.position() - 1) == FRAME_END
            and block.blockFormat() == QTextBlockFormat())


def _starts_with_table(parsed: QTextDocument) -> bool:
    """Whether a table is the first thing in it (not after a rule or an empty paragraph)."""
    return parsed.characterAt(0) == FRAME_START and parsed.begin().blockFormat() == QTextBlockFormat()


def _list_goes_on(last: QTextBlock, first: QTextBlock) -> bool:
    """Whether `first` is a list item right after one (`last`): inserted alone, its text would join that item."""
    return first.isValid() and first.textList() is not None and last.textList() is not None


def _starts_apart(parsed: QTextDocument) -> bool:
    """Whether it starts with a table or a rule (or nothing): Qt may put an empty block before those."""
    first = parsed.begin()
    return (parsed.isEmpty() or parsed.characterAt(0) == FRAME_START
            or first.blockFormat().hasProperty(QTextFormat.Property.BlockTrailingHorizontalRulerWidth))


def _insert(cursor: QTextCursor, parsed: QTextDocument) -> None:
    """`parsed` at the end of the document in a new block that takes the formats of its first block (a fragment
    leaves them behind; at the very start Qt applies them itself)."""
    doc = cursor.document()
    # Qt starts a list item's block itself, and a table's after another table (in the block that ends that one)
    if cursor.position() == 0 or parsed.begin().textList() is not None or (
            _starts_with_table(parsed) and _after_table(cursor.block())):
        cursor.insertFragment(QTextDocumentFragment(parsed))
        return
    cursor.insertBlock()
    first = cursor.position()
    cursor.insertFragment(QTextDocumentFragment(parsed))
    fix = QTextCursor(doc)
    fix.setPosition(first)
    fix.setBlockFormat(parsed.begin().blockFormat())
    fix.setBlockCharFormat(parsed.begin().charFormat())
