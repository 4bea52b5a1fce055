"""A streaming answer's last block when it is a growing table or list, rendered a row or an item at a time.

markdown-it renders a block whole, so each token of a 200-row table or a 300-item list parsed all of it again (10-27 ms
a token on a 2-core Xeon). A table row's HTML depends only on the header (its column count and alignments) and on its own
line; a top-level list item's only on its own lines and on whether the list is loose (any item alone loose, or a blank
line between two items: CommonMark's rule). Each row or item is rendered alone once and kept; the block's HTML is
joined from them, the same as markdown-it's render of the whole. Anything else (a table after text in the same block,
a line that is not a row, code or references in a list) returns None: the caller renders the block whole.

A table still growing over CHUNK_ROWS rows is cut into chunks, tables of CHUNK_ROWS rows one after another (the header
in the first), the seams without margin and overlapping by the cell spacing: Qt lays out a whole table again on every
change in it (~55 us a row a token on a 2-core Xeon), a chunk only its own rows. The view's document gives them the
same column widths (app/qt/table_chunks.py) and joins them into one table once it is complete (join_chunks).
"""
from __future__ import annotations

import re
from collections import OrderedDict

from markdown_it import MarkdownIt

KEEP = 4096  # rows and items kept rendered (several answers stream at once)
MAX_CELLS = 0x10000  # markdown-it ends a table once it filled in this many missing cells: such tables render whole
DELIMITER = re.compile(r" {0,3}\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*")
ITEM = re.compile(r"([-+*]|\d{1,9}([.)]))([ \t]|$)")  # a top-level item's first line: its bullet, or its number's delimiter
TABLE_END = "</table>\n"
BODY, BODY_END = "<tbody>\n", "</tbody>\n" + TABLE_END
STREAM_TABLES = 8  # growing tables whose rows are remembered in order (compare columns stream 4 at once)
CHUNK_ROWS = 24  # body rows of a growing table's chunk: its last one's rows are laid out again on every token
MARGINS = re.compile(r' style="margin-top:(-?\d+)px; margin-bottom:(-?\d+)px">\n')  # ending the renderer's table tag
SPACING = re.compile(r' cellspacing="(\d+)"')


class GrowingBlocks:
    """Rows and items of growing blocks, rendered once each by `md` (the answer's MarkdownIt, its rules and all)."""

    def __init__(self, md: MarkdownIt, seam: str = ""):
        """`seam`: put between the text before a table and the table, where the caller may cut the HTML (the two go
        into its document apart: the table grows in place there)."""
        self._md, self._seam = md, seam
        self._rows: OrderedDict[tuple[str, str], str | None] = OrderedDict()
        self._items: OrderedDict[tuple[str, bool], tuple[str, str, str, bool] | None] = OrderedDict()
        # a growing table's head -> its rows but the last and their bodies' HTML, as last rendered: a token looks up only
        # the rows after them (every row looked up again: ~0.2 ms a token at 400 rows here, ~0.55 at 1,000)
        self._tables: OrderedDict[str, tuple[list[str], list[str]]] = OrderedDict()

    def render(self, text: str, env: dict, new_at_most: int | None = None) -> str | None:
        """render(text)'s HTML where `text` is one table or one list, else None; None too where more than `new_at_most`
        of its rows or items are not rendered yet (a block that did not stream: rendered whole, that is quicker)."""
        if text.startswith("|"):
            return self._table(text, env, new_at_most)
        if "```" in text or "~~~" in text or "]:" in text:
            return None
        if ITEM.match(text):
            return self._list(text, env, new_at_most)
        table = _table_start(text)
        if table is not None:  # "Here is the table:" then the table on the next line: the text rendered once, the table apart
            joined = self._after_head(text[:table], text[table:], env, new_at_most)
            if joined is not None:
                return joined
        # the text before a list ("Steps:", a heading), a blank line after it or a list that can end its paragraph:
        # rendered whole once, the list apart
        lines = text.split("\n")
        start = next((i for i, line in enumerate(lines) if ITEM.match(line.lstrip())), None)
        if start is None or not ITEM.match(lines[start]) or (lines[start - 1] != "" and not _interrupts(lines[start])):
            return None
        head = "\n".join(lines[:start]) + "\n"
        if _over(new_at_most, (head, None) not in self._rows):
            return None
        listed = self._list("\n".join(lines[start:]), env, new_at_most)
        head_html = self._cached(self._rows, (head, None), lambda: self._plain(head, env))
        return None if listed is None or head_html is None else head_html + listed

    def _after_head(self, head: str, table: str, env: dict, new_at_most: int | None) -> str | None:
        """A table that ends the paragraph or heading before it: the two as render() of both, where they render so apart
        (in a quote or a list item the table's lines are that text's: then None)."""
        start = "\n".join(table.split("\n", 2)[:2]) + "\n"  # the table's header and delimiter: where it starts
        if _over(new_at_most, (head, None) not in self._rows):
            return None
        head_html = self._cached(self._rows, (head, None), lambda: self._plain(head, env))
        apart = self._cached(self._rows, (head + start, None), lambda: self._plain(head + start, env))
        table_html, started = self._table(table, env, new_at_most), self._table(start, env, None)
        if None in (head_html, table_html, started) or apart != head_html + started:
            return None
        return head_html + self._seam + table_html

    def _plain(self, text: str, env: dict) -> str | None:
        """render(text), or None where it holds a code block (its copy link's number follows the blocks before it)."""
        mine = {**env, "code_blocks": []}
        html = self._md.render(text, mine)
        return None if mine["code_blocks"] else html

    def _table(self, text: str, env: dict, new_at_most: int | None) -> str | None:
        lines = text.rstrip("\n").split("\n")  # the blank line that ends a table is none of its rows
        if len(lines) < 2 or not DELIMITER.fullmatch(lines[1]):
            return None
        head, rows = f"{lines[0]}\n{lines[1]}\n", lines[2:]
        known_rows, known = self._tables.get(head, ([], []))
        if rows[:len(known_rows)] != known_rows:
            known_rows, known = [], []
        new = rows[len(known_rows):]
        if _over(new_at_most, (head, "") not in self._rows, *((head, row) not in self._rows for row in new)):
            return None
        head_html = self._cached(self._rows, (head, ""), lambda: self._plain(head, env))
        if head_html is None or not (head_html.startswith("<table") and head_html.endswith("</thead>\n" + TABLE_END)):
            return None
        # a line not starting with '|' may be another block's start (a heading, a quote) or lazy text: render whole
        if any(not row.startswith("|") for row in new) or len(rows) * head_html.count("<th") > MAX_CELLS:
            return None
        row_html = lambda row: _body(self._plain(head + row + "\n", env), head_html)  # noqa: E731
        bodies = [self._cached(self._rows, (head, row), lambda row=row: row_html(row)) for row in new]
        if any(body is None for body in bodies):
            return None
        if not rows:
            return head_html
        html = known + [body[len(BODY):] for body in bodies]
        self._tables[head] = (rows[:-1], html[:-1])  # its last row may still grow
        self._tables.move_to_end(head)
        while len(self._tables) > STREAM_TABLES:
            self._tables.popitem(last=False)
        if env.get("streaming") and env.get("growing") and len(html) > CHUNK_ROWS:
            chunked = _chunks(head_html, html)
            if chunked is not None:
                return self._seam.join(chunked)
        return head_html[:-len(TABLE_END)] + BODY + "".join(html) + BODY_END

    def _list(self, text: str, env: dict, new_at_most: int | None) -> str | None:
        """One list, or lists one after another (an item of another kind starts another: "10. a" then "   - note", which
        three spaces do not nest), each joined from its items."""
        lists = _lists(text)
        if lists is None:
            return None
        html = [self._one_list(items, env, new_at_most, k == len(lists) - 1) for k, items in enumerate(lists)]
        return None if None in html else "".join(html)

    def _one_list(self, items: list[str], env: dict, new_at_most: int | None, last: bool) -> str | None:
        if any("\n\n\n" in item or not _content(item.split("\n", 1)[0]) for item in items[:-1 if last else None]):
            return None  # an empty item, or two blank lines: where CommonMark may end the list
        # a blank line between two items makes the list loose (one at the end of the last does not)
        loose = any(item.endswith("\n\n") for item in items[:-1])
        if _over(new_at_most, *((item, loose) not in self._items for item in items)):
            return None
        rendered = self._join(items, env, loose)
        if rendered is not None and not loose and rendered[1]:  # an item loose alone makes the whole list loose
            rendered = self._join(items, env, loose=True)
        return None if rendered is None else rendered[0]

    def _join(self, items: list[str], env: dict, loose: bool) -> tuple[str, bool] | None:
        """(the list's HTML, whether an item is loose alone), or None where an item does not read as one."""
        rendered = [self._item(item, env, loose) for item in items]
        if any(r is None for r in rendered):
            return None
        return rendered[0][1] + "".join(r[0] for r in rendered) + rendered[0][2], any(r[3] for r in rendered)

    def _item(self, item: str, env: dict, loose: bool) -> tuple[str, str, str, bool] | None:
        """(the item's HTML, its list's opening and closing tags, whether it is loose alone) or None where `item` does
        not read as a list of that one item."""
        return self._cached(self._items, (item, loose), lambda: self._one_item(item, env, loose))

    def _one_item(self, item: str, env: dict, loose: bool) -> tuple[str, str, str, bool] | None:
        mine = {**env, "code_blocks": []}
        tokens = self._md.parse(item, mine)
        if not tokens or not tokens[0].type.endswith("_list_open") or tokens[-1].type != tokens[0].type[:-5] + "_close":
            return None
        if sum(t.type == "list_item_open" and t.level == 1 for t in tokens) != 1 or any(
                t.level == 0 for t in tokens[1:-1]):
            return None
        paragraphs = [t for t in tokens if t.type in ("paragraph_open", "paragraph_close") and t.level == 2]
        alone = any(not t.hidden for t in paragraphs)
        for t in paragraphs:  # markdown-it hides a tight list's paragraphs (markTightParagraphs)
            t.hidden = not loose
        html = self._md.renderer.render(tokens, self._md.options, mine)
        if mine["code_blocks"]:
            return None
        opening, rest = html.split("\n", 1)
        body, closing = rest[:rest.rindex("</")], rest[rest.rindex("</"):]
        return body, opening + "\n", closing, alone

    @staticmethod
    def _cached(cache: OrderedDict, key, make):
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        cache[key] = value = make()
        while len(cache) > KEEP:
            cache.popitem(last=False)
        return value


def _chunks(head_html: str, rows: list[str]) -> list[str] | None:
    """A table's HTML as tables of CHUNK_ROWS body rows, the header in the first, drawn as the one table (the seams
    without margin, each after the first drawn up by the cell spacing onto the one before it); None where its tag is not
    the renderer's."""
    tag_end = head_html.index(">\n") + 2
    tag, head = head_html[:tag_end], head_html[tag_end:-len(TABLE_END)]
    margins, spacing = MARGINS.search(tag), SPACING.search(tag)
    if margins is None or margins.end() != len(tag) or spacing is None:
        return None
    top, bottom = margins.groups()

    def opening(top: str, bottom: str) -> str:
        return f'{tag[:margins.start()]} style="margin-top:{top}px; margin-bottom:{bottom}px">\n'

    starts = range(0, len(rows), CHUNK_ROWS)
    return [opening(top if at == 0 else f"-{spacing.group(1)}", bottom if at == starts[-1] else "0")
            + (head if at == 0 else "") + BODY + "".join(rows[at:at + CHUNK_ROWS]) + BODY_END
            for at in starts]


def chunk_run(parts: list[str]) -> int:
    """How many of the last of `parts` are the chunks of a growing table (the last with what follows it: the cursor, a
    note), or 0."""
    start = len(parts)
    while start and _margins(parts[start - 1], top="-"):
        start -= 1
    return len(parts) - start + 1 if start < len(parts) and start and _margins(parts[start - 1], bottom="0") else 0


def chunk_tables(parts: list[str]) -> list[str]:
    """The tables of chunk_run's parts: what follows the last left out."""
    return [part[:part.rindex(TABLE_END) + len(TABLE_END)] for part in parts]


def join_chunks(chunks: list[str]) -> str:
    """The one table whose chunks (chunk_tables) `chunks` are, as render() writes it."""
    first, last = MARGINS.search(chunks[0]), MARGINS.search(chunks[-1])
    body = [chunk[chunk.index(BODY) + len(BODY):-len(BODY_END)] for chunk in chunks]
    return (f'{chunks[0][:first.start()]} style="margin-top:{first.group(1)}px; margin-bottom:{last.group(2)}px">\n'
            + chunks[0][first.end():chunks[0].index(BODY)] + BODY + "".join(body) + BODY_END)


def table_rows(part: str) -> tuple[str, list[str], str] | None:
    """(a table's HTML up to its body, its body's rows, what follows it) of a part that is one table with rows, else
    None."""
    if not part.startswith("<table") or part.count("<table") != 1 or BODY not in part:
        return None
    head, rest = part.split(BODY, 1)
    body, end = rest.split(BODY_END, 1) if BODY_END in rest else ("", None)
    if end is None or not body.endswith("</tr>\n"):
        return None
    return head, [row + "</tr>\n" for row in body.split("</tr>\n")[:-1]], end


def _margins(part: str, top: str = "", bottom: str = "") -> bool:
    """Whether `part` starts with a table's tag of the renderer's, its top margin starting with `top`, its bottom one
    `bottom` where given (a chunk's after the first: negative; a chunk's before the last: 0)."""
    tag = part[:part.find(">\n") + 2] if part.startswith("<table") else ""
    margins = MARGINS.search(tag)
    return (margins is not None and margins.end() == len(tag) and margins.group(1).startswith(top)
            and (not bottom or margins.group(2) == bottom))


def _over(new_at_most: int | None, *missing: bool) -> bool:
    """Whether more rows or items are missing than a render may take."""
    return new_at_most is not None and sum(missing) > new_at_most


def _body(html: str, head_html: str) -> str | None:
    """The `<tbody>` of a table of one row rendered after the head, or None where the row did not read as one."""
    start = head_html[:-len(TABLE_END)]
    if html is None or not html.startswith(start) or not html.endswith("</tbody>\n" + TABLE_END):
        return None
    body = html[len(start):-len("</tbody>\n" + TABLE_END)]
    return body if body.count("<tr>") == 1 else None


def _lists(text: str) -> list[list[str]] | None:
    """The items of each list of a text of lists, or None where an item does not start plainly: an item's line is one
    outside the item before's content column (three spaces at most: more make it that item's text)."""
    if "\t" in text:
        return None
    lines, starts, column = text.split("\n"), [], 0
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip(" "))
        mark = ITEM.match(line, indent)
        if mark is None or (starts and indent >= column):
            if not starts:
                return None
            continue  # the item's text, or a list nested in it
        if indent > 3:
            return None
        starts.append(i)
        rest = line[mark.end(1):]
        spaces = len(rest) - len(rest.lstrip(" "))
        column = mark.end(1) + (spaces if 0 < spaces <= 4 and rest.strip() else 1)
    items = ["\n".join(lines[a:b]) + "\n" for a, b in zip(starts, starts[1:] + [len(lines)])]
    items[-1] = items[-1][:-1]  # as the text ends
    lists = [[items[0]]]
    for previous, item in zip(items, items[1:]):
        if _kind(item.lstrip(" ")) == _kind(previous.lstrip(" ")):
            lists[-1].append(item)
        else:
            lists.append([item])  # another kind of item starts another list
    return lists


def _table_start(text: str) -> int | None:
    """Where a table starts in a text that does not start with one: a line starting with '|' and a delimiter row after
    it, after text with no blank line (else the blocks were apart)."""
    at, lines = 0, text.split("\n")
    for line, following in zip(lines, lines[1:]):
        if at and line.startswith("|") and DELIMITER.fullmatch(following):
            return at
        if not line.strip():
            return None
        at += len(line) + 1
    return None


def _interrupts(line: str) -> bool:
    """Whether an item's line ends a paragraph before it (CommonMark: a bullet with text, or the number 1 with text);
    else it is that paragraph's text."""
    mark = ITEM.match(line)
    return bool(_content(line)) and (not mark.group(2) or int(mark.group(1)[:-1]) == 1)


def _content(line: str) -> str:
    """An item's first line after its marker."""
    return line[ITEM.match(line, len(line) - len(line.lstrip(" "))).end():].strip()


def _kind(line: str) -> str:
    """What continues a list: the same bullet, or a number with the same delimiter."""
    mark = ITEM.match(line)
    return (mark.group(2) or mark.group(1)) if mark else ""
