"""A streaming answer's document is edited where its text changed, and reads as a fresh render of it at every step."""
from __future__ import annotations

import itertools

import pytest

from app.core.conversations import Message
from app.core.markdown_render import MarkdownRenderer
from app.core.message_html import message_html

BLOCKS = {"p": "A paragraph with *emphasis*.\n", "h2": "## Heading\n", "ul": "- a\n- b\n", "ol": "1. one\n2. two\n",
          "code": "```python\nx = 1\n```\n", "table": "| a | b |\n|---|---:|\n| 1 | 2 |\n", "quote": "> quoted\n",
          "hr": "---\n", "lone #": "#\n", "empty item": "- a\n-\n", "math": "$$\nx^2\n$$\n"}


FINISH = (("done", None),)


def _streamed(texts: list[str], renderer: MarkdownRenderer, thought: str = "",
              finish: tuple = FINISH) -> list[tuple[str, str]]:
    """(document's HTML, a fresh render's) after each text of a growing answer, and after it ends as `finish` says."""
    from app.qt.stream_document import SafeDocument, StreamDocument

    doc = SafeDocument()
    stream = StreamDocument(doc)
    out = []
    for text in texts:
        rendered = message_html(Message(1, 1, None, "assistant", thought + text, "streaming"), 1, 1, renderer, busy=True)
        stream.update(list(rendered.parts))
        fresh = SafeDocument()
        fresh.setHtml(rendered.html)
        out.append((doc.toHtml(), fresh.toHtml()))
    started = SafeDocument()  # a document that starts mid-stream (a chat opened while it answers) takes it all at once
    StreamDocument(started).update(list(rendered.parts))
    out.append((started.toHtml(), fresh.toHtml()))
    for state, stats in finish:  # the answer ends: its header (links of a chat no longer busy), blocks and note change
        rendered = message_html(Message(1, 1, None, "assistant", thought + texts[-1], state, stats=stats), 1, 1,
                                renderer, busy=False)
        stream.update(list(rendered.parts))
        fresh = SafeDocument()
        fresh.setHtml(rendered.html)
        out.append((doc.toHtml(), fresh.toHtml()))
    return out


@pytest.mark.parametrize("first", list(BLOCKS))
def test_every_step_of_a_stream_reads_as_a_fresh_render(qapp, first):
    """Qt keeps or drops an empty block beside a table, a rule, a list or an empty heading depending on what came
    before: each pair of blocks, and the growing text before them, must still read as setHtml of the whole."""
    renderer = MarkdownRenderer()
    for second, third in itertools.product(BLOCKS, ["ul"]):
        text = "\n".join([BLOCKS[first], BLOCKS[second], BLOCKS[third]])
        steps = [text[:n] for n in range(1, len(text) + 1, 5)] + [text]
        for got, fresh in _streamed(steps, renderer):
            assert got == fresh, (first, second, third)


def test_a_thought_then_its_reply_read_as_a_fresh_render(qapp):
    steps = ["", "Para\n\n", "Para\n\n| a |\n|---|\n| 1 |\n\n---\n\nEnd"]
    for got, fresh in _streamed(steps, MarkdownRenderer(), thought="<think>\nhmm\n\nso</think>\n\n"):
        assert got == fresh


def test_a_long_streaming_answer_is_edited_in_place_and_ends_as_a_fresh_render(parley, qtbot):
    """Each token rebuilt the whole document of the answer (setHtml and a full layout: ~400 ms a frame at 100,000
    characters); now only its last block is replaced, and when it ends its header and last block."""
    from app.qt.stream_document import SafeDocument

    section = "## Part\n\nSome words in a paragraph.\n\n```python\nx = 1\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
    text = section * 250  # ~25,000 characters
    conv = parley.service.new_conversation()
    user = parley.store.add_message(conv, None, "user", "Write a lot")
    answer = parley.store.add_message(conv, user.id, "assistant", text, state="streaming")
    parley.window.open_chat(conv)
    delegate = parley.window.chat.view.delegate
    doc, _ = delegate.document(answer)
    qtbot.waitUntil(lambda: answer.id not in delegate._partial)  # opened mid-answer: it goes in a slice a turn
    changed = []
    doc.contentsChange.connect(lambda _pos, removed, added: changed.append(removed + added))
    for token in ["The", " last", " words", "."]:
        changed.clear()  # a token that starts a block also puts the one before it in again, without the cursor
        answer = parley.store.append_text(answer.id, token)
        assert delegate.document(answer)[0] is doc
    assert 0 < sum(changed) < 200 and doc.availableUndoSteps() == 0  # the last block only; no undo history kept
    fresh = SafeDocument()
    fresh.setDefaultFont(doc.defaultFont())
    fresh.setDefaultStyleSheet(doc.defaultStyleSheet())
    fresh.setHtml(message_html(answer, 1, 1, delegate.renderer, busy=False).html)
    assert doc.toHtml() == fresh.toHtml()

    changed.clear()
    answer = parley.store.update_message(answer.id, state="done")
    done, _ = delegate.document(answer)
    assert sum(changed) < 2_000  # its header, last block and note
    fresh.setHtml(message_html(answer, 1, 1, delegate.renderer, busy=False).html)
    assert done is doc and done.toHtml() == fresh.toHtml()
    fresh.setDocumentMargin(0)
    fresh.setTextWidth(done.textWidth())
    assert fresh.size() == done.size()
    for top in (0, done.size().height() - 1_500):  # as drawn: the header and the last blocks, where it changed
        assert _drawn(done, top) == _drawn(fresh, top)


def _drawn(doc, top: float):
    """1,500 pixels of `doc` from `top`, drawn as the view draws it."""
    from PySide6.QtCore import QRectF
    from PySide6.QtGui import QAbstractTextDocumentLayout, QImage, QPainter

    image = QImage(int(doc.textWidth()), 1_500, QImage.Format.Format_ARGB32)
    image.fill(0xFFFFFFFF)
    painter = QPainter(image)
    painter.translate(0, -top)
    ctx = QAbstractTextDocumentLayout.PaintContext()
    ctx.clip = QRectF(0, top, doc.textWidth(), 1_500)
    doc.documentLayout().draw(painter, ctx)
    painter.end()
    return image


def test_an_answer_ends_in_the_document_it_streamed_in_as_a_fresh_render(qapp):
    """When an answer ended, the view rendered it afresh (a 60,000-character one: ~250 ms of Markdown, then setHtml and
    a layout of all of it, a 200-400 ms stall); its streamed document now takes the parts that changed, in place, the
    groups after them kept: the header, a long code block highlighted only now, the last block and the note."""
    code = "".join(f"x_{i} = f({i})  # step {i}\n" for i in range(210))
    text = (f"Intro.\n\nThen code:\n\n```python\n{code}```\n\nAfter the code.\n\nA paragraph alone.\n\n- a list\n- goes on\n\n"
            "| a |\n|---|\n| 1 |\n\nLast words.")
    steps = [text[:n] for n in (6, len(text) // 2, len(text) - 20, len(text))]
    ends = (("stopped", None), ("done", {"reason": "length", "seed": 7}), ("done", None), ("error", None))
    for got, fresh in _streamed(steps, MarkdownRenderer(), finish=ends):
        assert got == fresh
    for got, fresh in _streamed(steps, MarkdownRenderer(), thought="<think>\nhmm\n</think>\n\n", finish=ends):
        assert got == fresh


def test_text_after_a_table_streams_without_the_table_going_in_again(qapp):
    """Each token of a paragraph after a table took the table out and put it in again with the paragraph (in the bench's
    60,000-character answer its last code block, table and paragraph: ~50 ms a token here). Qt ends a table with a
    block of its own, so what follows goes in alone."""
    from app.qt.stream_document import SafeDocument, StreamDocument

    renderer = MarkdownRenderer()
    table = "| n | n² |\n|---|---:|\n" + "".join(f"| {i} | {i * i} |\n" for i in range(50))
    doc = SafeDocument()
    stream = StreamDocument(doc)
    for text in ["Intro.\n\n" + table + "\nAfter the table", "Intro.\n\n" + table + "\nAfter the table, more words"]:
        rendered = message_html(Message(1, 1, None, "assistant", text, "streaming"), 1, 1, renderer, busy=True)
        stream.update(list(rendered.parts))
        fresh = SafeDocument()
        fresh.setHtml(rendered.html)
        assert doc.toHtml().replace(" -qt-user-state:7;", "") == fresh.toHtml()
        if "more" not in text:  # a mark on the table's last row: it stays only where the table stays in
            doc.findBlock(doc.toPlainText().index("2401")).setUserState(7)
    assert doc.findBlock(doc.toPlainText().index("2401")).userState() == 7


def test_a_chat_opened_mid_answer_takes_its_long_answer_a_slice_a_turn(parley, qtbot):
    """Opening a chat whose answer was streaming built all of its document at once (a 60,000-character answer: setHtml
    and a layout of all of it, a 200-400 ms stall on this 2-core Xeon, growing with the answer); now each turn of the
    event loop takes a slice of about 12,000 characters of HTML, and the document ends as a fresh render."""
    from app.qt.stream_document import SLICE_CHARS, SafeDocument

    section = "## Part\n\nSome words in a paragraph.\n\n```python\nx = 1\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
    conv = parley.service.new_conversation()
    user = parley.store.add_message(conv, None, "user", "Write a lot")
    answer = parley.store.add_message(conv, user.id, "assistant", section * 250, state="streaming")
    parley.window.open_chat(conv)
    delegate = parley.window.chat.view.delegate
    doc, _ = delegate.document(answer)
    html = message_html(answer, 1, 1, delegate.renderer, busy=False).html
    assert len(html) > 8 * SLICE_CHARS and doc.characterCount() < len(answer.content) / 4  # the first slice
    qtbot.waitUntil(lambda: answer.id not in delegate._partial)
    fresh = SafeDocument()
    fresh.setDefaultFont(doc.defaultFont())
    fresh.setDefaultStyleSheet(doc.defaultStyleSheet())
    fresh.setHtml(html)
    assert delegate.document(answer)[0] is doc and doc.toHtml() == fresh.toHtml()


def test_a_document_catching_up_takes_a_slice_each_call_whatever_its_budget(qapp):
    """A call whose budget was spent before its first slice (a slow machine, a big replace) put nothing in, so a
    document could stay behind for as long as that went on; each call now takes one slice at least."""
    from app.qt.stream_document import SafeDocument, StreamDocument

    text = "".join(f"## Part {i}\n\nSome words, *a few*.\n\n| a | b |\n|---|---|\n| {i} | 2 |\n\n" for i in range(300))
    rendered = message_html(Message(1, 1, None, "assistant", text, "streaming"), 1, 1, MarkdownRenderer(), busy=True)
    doc = SafeDocument()
    stream = StreamDocument(doc)
    calls = 1
    while not stream.update(list(rendered.parts), budget=0.0) and calls < 500:
        calls += 1
    fresh = SafeDocument()
    fresh.setHtml(rendered.html)
    assert stream.complete and 1 < calls < 500 and doc.toHtml() == fresh.toHtml()


@pytest.mark.parametrize("dark", [False, True])
def test_a_growing_code_block_puts_in_its_last_run_only_and_draws_as_one_table(qapp, dark):
    """Each token of a growing code block parsed its whole table's HTML again and Qt laid all of the table out again
    (a 199-line block: ~25 ms a token on a 2-core Xeon, growing with it). It streams as a table a run of lines, the
    seams without padding: a token puts in the last run only, and the runs draw as the one table they become."""
    from PySide6.QtGui import QImage

    import app.core.markdown_render as md
    from app.qt.stream_document import SafeDocument, StreamDocument

    renderer = MarkdownRenderer(dark=dark)
    lines = [f"    total_{i} = compute(values[{i}], scale={i}.5)  # step {i}" for i in range(120)]
    lines[60] = "    note = '" + "wrapped " * 20 + "'"  # wraps at the width drawn
    text = "Here is the code:\n\n```python\ndef f(values):\n" + "\n".join(lines) + "\n"
    steps = [text[:n] for n in range(len(text) - 2_400, len(text) + 1, 150)]
    for got, fresh in _streamed(steps, renderer):  # every step, across the runs' seams, and the end
        assert got == fresh
    doc = SafeDocument()
    doc.documentLayout()  # laid out as the view's are (a document without a layout reports no changes)
    stream = StreamDocument(doc)
    changed = []
    doc.contentsChange.connect(lambda _pos, removed, added: changed.append(removed + added))
    for end in ("", "    x", "    x = 1"):
        changed.clear()
        stream.update(list(message_html(Message(1, 1, None, "assistant", text + end, "streaming"), 1, 1, renderer,
                                        busy=True).parts))
    run = sum(len(line) + 1 for line in lines[-md.STREAM_SEGMENT_LINES:])
    assert 0 < sum(changed) < 2 * run + 100  # the last run out and in again, not the block (~5,600 characters)

    def drawn(html: str) -> QImage:
        page = SafeDocument()
        page.setDocumentMargin(0)
        page.setTextWidth(500)
        page.setHtml(html)
        return _drawn(page, 0)

    streamed, whole = MarkdownRenderer(dark=dark).render_streaming(text)[0], renderer.render(text)[0]
    assert streamed.count("<table") == -(-121 // md.STREAM_SEGMENT_LINES) and whole.count("<table") == 1
    assert drawn(streamed) == drawn(whole)


def test_an_answer_that_ends_in_a_long_code_block_keeps_its_runs(qapp):
    """When an answer ended in a long code block, the block went in again as one table (its HTML parsed and the table
    laid out: ~25 ms at 190 lines on a 2-core Xeon, 4 compare columns ending together ~100 ms more); a finished block
    is now the same tables a run of lines, so the end puts in the header, the last run and the note."""
    from app.qt.stream_document import SafeDocument, StreamDocument

    renderer = MarkdownRenderer()
    code = "".join(f"    total_{i} = compute(values[{i}], scale={i}.5)  # step {i}\n" for i in range(190))
    text = f"Here is the code:\n\n```python\ndef f(values):\n{code}```\n"
    doc = SafeDocument()
    doc.documentLayout()  # a document without a layout reports no changes
    stream = StreamDocument(doc)
    changed = []
    doc.contentsChange.connect(lambda _pos, removed, added: changed.append(removed + added))
    for state, busy in (("streaming", True), ("done", False)):
        changed.clear()
        rendered = message_html(Message(1, 1, None, "assistant", text, state), 1, 1, renderer, busy=busy)
        stream.update(list(rendered.parts))
    fresh = SafeDocument()
    fresh.setHtml(rendered.html)
    assert doc.toHtml() == fresh.toHtml()
    assert 0 < sum(changed) < 2_000  # not the block's ~11,000 characters


def _table_text(rows: int) -> str:
    body = "".join(f"| Country {i} | *City* {i * 7 % 13} | {i * 1234:,} | `r{i}` |\n" for i in range(rows))
    return f"Intro.\n\n| Country | Capital | Population | Code |\n|:---|---|---:|:-:|\n{body}\nAfter it.\n\n| a |\n|---|\n| 1 |\n"


def test_a_growing_table_takes_its_new_rows_in_place_and_reads_as_a_fresh_render(qapp):
    """Rows (a partial last one too, its missing cells filled in) go into the table in the document, column widths and
    alignments as setHtml of the whole lays them out, at every step, then a paragraph and a table after it."""
    text = _table_text(12)
    steps = [text[:n] for n in range(1, len(text) + 1, 3)] + [text]
    for got, fresh in _streamed(steps, MarkdownRenderer()):
        assert got == fresh


def test_an_update_at_the_end_of_a_long_table_parses_its_new_rows_not_the_table(qapp):
    """Each token at the end of a 200-row table parsed all of its HTML again (~60,000 characters) and put it in again."""
    from app.qt.stream_document import SafeDocument, StreamDocument

    renderer, text = MarkdownRenderer(), _table_text(200).split("\nAfter")[0]
    stream = StreamDocument(SafeDocument())
    parse, seen = stream._parse, []
    stream._parse = lambda html, end=False: (seen.append(len(html)), parse(html, end))[1]
    sizes = []
    for n in range(len(text) - 300, len(text) + 1, 4):
        rendered = message_html(Message(1, 1, None, "assistant", text[:n], "streaming"), 1, 1, renderer, busy=True)
        seen.clear()
        stream.update(list(rendered.parts))
        sizes.append(sum(seen))
    assert max(sizes[1:]) < 5_000, sizes


def _counted(renderer: MarkdownRenderer, stream) -> tuple[list[int], list[int]]:
    """Characters markdown-it and the document parse, appended to as they do."""
    md_seen, doc_seen = [], []
    md_parse, doc_parse = renderer._md.parse, stream._parse
    renderer._md.parse = lambda src, env=None: (md_seen.append(len(src)), md_parse(src, env))[1]
    stream._parse = lambda html, end=False: (doc_seen.append(len(html)), doc_parse(html, end))[1]
    return md_seen, doc_seen


@pytest.mark.parametrize("after", ["", "\nAfter it"])
def test_a_streamed_table_ends_without_being_rendered_or_put_in_again(qapp, after):
    """When a streamed table ended (the answer's end, or the first words after it), it was rendered whole and put into
    the document again: a 200-row table ~11 ms of Markdown and ~50 ms of document here, four compare columns four times
    that. Its rows stay, what follows goes in after it, and the document reads as a fresh render."""
    from app.qt.stream_document import SafeDocument, StreamDocument

    renderer, table = MarkdownRenderer(), _table_text(200).split("\nAfter")[0]
    doc = SafeDocument()
    stream = StreamDocument(doc)
    md_seen, doc_seen = _counted(renderer, stream)
    steps = [(table[:-40], "streaming"), (table, "streaming"), (table + after, "streaming"), (table + after, "done")]
    for text, state in steps:
        md_seen.clear()
        doc_seen.clear()
        rendered = message_html(Message(1, 1, None, "assistant", text, state), 1, 1, renderer, busy=state != "done")
        stream.update(list(rendered.parts))
        fresh = SafeDocument()
        fresh.setHtml(rendered.html)
        assert doc.toHtml() == fresh.toHtml(), (text[-20:], state)
        if text != table[:-40]:
            assert sum(md_seen) < 1_000, (state, sum(md_seen))  # the whole table: ~9,000
            assert sum(doc_seen) < 5_000, (state, sum(doc_seen))  # the whole table: ~57,000


def _list_text(items: int, start: int = 1, loose_at: int | None = None) -> str:
    body = "".join(f"{i + start}. Step **{i}**: run `make {i}` and check it\n"
                   + (" " * len(f"{i + start}. ") + "- a nested note\n" if i % 7 == 3 else "")
                   + ("\n" if i == loose_at else "") for i in range(items))
    return f"Do this:\n\n{body}"


def test_a_growing_list_takes_its_new_items_in_place_and_reads_as_a_fresh_render(qapp):
    """Numbering (a list from 9), nesting, a blank line half-way (the whole list loose: it goes in again), a list of
    another kind after it, at every step and at the end."""
    text = _list_text(12, start=9, loose_at=6) + "- a bullet list after\n- with two items\n"
    steps = [text[:n] for n in range(1, len(text) + 1, 3)] + [text]
    for got, fresh in _streamed(steps, MarkdownRenderer(), finish=(("done", None), ("stopped", None))):
        assert got == fresh


def _tail_parsed(renderer: MarkdownRenderer, text: str, tail: int = 300, step: int = 4) -> list[int]:
    """Streams the last `tail` characters of `text` `step` at a time, then its end: the characters of HTML the document
    parsed at each update; the document then reads as a fresh render of the whole."""
    from app.qt.stream_document import SafeDocument, StreamDocument

    doc = SafeDocument()
    stream = StreamDocument(doc)
    _, seen = _counted(renderer, stream)
    sizes = []
    for n, state in [(n, "streaming") for n in range(len(text) - tail, len(text) + 1, step)] + [(len(text), "done")]:
        rendered = message_html(Message(1, 1, None, "assistant", text[:n], state), 1, 1, renderer, busy=state != "done")
        seen.clear()
        stream.update(list(rendered.parts))
        sizes.append(sum(seen))
    fresh = SafeDocument()
    fresh.setHtml(rendered.html)
    assert doc.toHtml() == fresh.toHtml()
    return sizes


def test_an_update_at_the_end_of_a_long_list_parses_its_last_items_not_the_list(qapp):
    """Each token at the end of a 200-item list put all of it into the document again (~24,000 characters of HTML
    parsed, 14-19 ms a token here), and its end once more."""
    sizes = _tail_parsed(MarkdownRenderer(), _list_text(200))
    assert max(sizes[1:]) < 3_000, sizes


def test_text_after_a_table_streams_without_the_table_being_laid_out_again(qapp):
    """Each token of a paragraph after a table set the formats of the block Qt ends the table with, unchanged as they
    were, and Qt laid all of the table out again (a 200-row table: 32-40 ms a token here, and the answer's end once
    more): no change reaches the table now."""
    from PySide6.QtGui import QTextTable

    from app.qt.stream_document import SafeDocument, StreamDocument

    renderer, table = MarkdownRenderer(), _table_text(30).split("\nAfter")[0]
    doc = SafeDocument()
    doc.documentLayout()  # a document without a layout reports no changes
    stream = StreamDocument(doc)
    changed = []
    doc.contentsChange.connect(lambda position, _removed, _added: changed.append(position))
    words = "\nAfter the table, some words of a paragraph"
    for n, state in [(n, "streaming") for n in range(0, len(words) + 1, 6)] + [(len(words), "done")]:
        rendered = message_html(Message(1, 1, None, "assistant", table + words[:n], state), 1, 1, renderer,
                                busy=state != "done")
        changed.clear()
        stream.update(list(rendered.parts))
        frame = [frame for frame in doc.rootFrame().childFrames() if isinstance(frame, QTextTable)][-1]
        if n > 6:  # the paragraph's first words take the cursor from the table's part
            assert changed and not [p for p in changed if frame.firstPosition() - 1 <= p <= frame.lastPosition()], (
                n, state, changed, frame.lastPosition())
    fresh = SafeDocument()
    fresh.setHtml(rendered.html)
    assert doc.toHtml() == fresh.toHtml()


def test_a_table_right_after_a_line_of_text_takes_its_new_rows_in_place(qapp):
    """With no blank line between "Here is the table:" and a table, each token put all of the table into the document
    again (a 200-row table: ~57,000 characters of HTML parsed and 30 ms a token here, against 15 with the blank line):
    the line and the table are parts apart now, the table grows in place and reads as a fresh render."""
    renderer = MarkdownRenderer()
    sizes = _tail_parsed(renderer, _table_text(200).split("\nAfter")[0].replace("Intro.\n\n", "Intro.\n"))
    assert max(sizes[1:]) < 5_000, sizes
    steps = _table_text(12).replace("Intro.\n\n", "Intro.\n")
    for got, fresh_html in _streamed([steps[:n] for n in range(1, len(steps) + 1, 3)] + [steps], renderer):
        assert got == fresh_html


def test_lists_one_after_another_take_a_new_list_in_place(qapp):
    """Under "10." a note indented three spaces no longer nests: it starts a bullet list and the next number another
    numbered list. While each such list's first item was written, all the lists of the part went in again (the bench's
    300-item list: ~24,800 characters of HTML parsed, 20-25 ms, on 527 of 4,614 steps). A new list now goes in after
    the last item of a list before it (a note's one-item list may come between), numbered and spaced as a fresh render."""
    import random

    text = "Steps:\n\n" + "".join(f"{i + 1}. Step **{i}**: run `make {i}`\n" + ("   - a note\n" if i % 10 == 9 else "")
                                 for i in range(80))
    renderer = MarkdownRenderer()
    sizes = _tail_parsed(renderer, text, tail=400, step=3)
    assert max(sizes[1:]) < 3_000, max(sizes)
    rng, notes = random.Random(4), ["   - a note\n", "  - nested\n", "   1. sub\n", "\n", "   - \n", "-\n", "- x\n", "1) y\n"]
    for case in range(8):  # empty items and lists Qt leaves out, loose and nested items, numbers across 9 -> 10
        start = rng.choice([1, 8, 98])
        text = "".join(f"{start + i}. Step **{i}**\n" + (rng.choice(notes) if rng.random() < 0.4 else "")
                       for i in range(rng.randint(4, 9))) + rng.choice(["", "\nDone.", "\n- a\n- b\n"])
        steps = [text[:k] for k in range(1, len(text) + 1, rng.randint(1, 4))] + [text]
        for got, fresh_html in _streamed(steps, renderer):
            assert got == fresh_html, text


def _chunked_table(rows: int, columns: int) -> str:
    """A table whose rows grow wider down the table, one late row widest of all (its column widths change there)."""
    cell = lambda i, c: f"*w{i}*" if c % 2 else "word " * (i % 5) + f"`{i * 1234:,}`"  # noqa: E731
    body = "".join("| " + " | ".join(cell(i, c) if i != rows - 3 else "a much wider late cell " * (c + 1)
                                     for c in range(columns)) + " |\n" for i in range(rows))
    return "Intro.\n\n|" + "|".join(f" h{c} " for c in range(columns)) + "|\n|" + "---|" * columns + "\n" + body


@pytest.mark.parametrize(("columns", "dark"), [(4, False), (4, True), (1, False)])
def test_a_long_growing_table_streams_in_chunks_drawn_as_the_one_table(qapp, columns, dark):
    """Each token in the last row of a long table made Qt lay out all of the table again (~55 us a row: 23 ms a token at
    400 rows on a 2-core Xeon). It streams as tables of CHUNK_ROWS rows, a token changing only the last; the chunks take
    the one table's column widths (a late wider row widens all of them) and draw as it, and the finished answer's table
    is one again, as a fresh render. A one-column chunk of one empty cell (a row just begun) is laid out at its
    width."""
    from PySide6.QtGui import QTextTable

    from app.core.growing_block import CHUNK_ROWS, chunk_run, chunk_tables, join_chunks
    from app.qt.stream_document import SafeDocument, StreamDocument

    renderer, text = MarkdownRenderer(dark=dark), _chunked_table(2 * CHUNK_ROWS + 12, columns)

    def page(html: str | None = None):
        doc = SafeDocument()
        doc.setDocumentMargin(0)
        doc.setTextWidth(500)
        if html is not None:
            doc.setHtml(html)
        return doc

    doc = page()
    stream = StreamDocument(doc)
    changed = []
    doc.contentsChange.connect(lambda position, _removed, _added: changed.append(position))
    third = len("\n".join(text.split("\n")[:4 + 2 * CHUNK_ROWS])) + 2  # the third chunk's first row: "|" alone
    ends = [third - 200, third, third + 3] + list(range(len(text) - 150, len(text) + 1, 30))
    for n in ends:  # a new chunk's first row, and rows through a late wider one
        parts = list(renderer.render_streaming_parts(text[:n])[0])
        changed.clear()
        stream.update(parts)
        run = chunk_run(parts)
        assert run == (2 if n < third else 3), n
        tables = [frame for frame in doc.rootFrame().childFrames() if isinstance(frame, QTextTable)]
        if n > len(text) - 150:  # a token within the last chunk: the chunks before it are not touched
            assert changed and min(changed) > tables[-2].lastPosition(), n
        one = parts[:-run] + [join_chunks(chunk_tables(parts[-run:]))]
        assert _drawn(doc, 0) == _drawn(page("".join(one)), 0), n
    for ended in (renderer.render_streaming_parts(text + "\nAfter it.")[0], renderer.render_parts(text + "\nAfter it.")[0]):
        stream.update(list(ended))  # the table complete, words after it: one table, its widths Qt's own
        fresh = page("".join(ended))
        assert len([f for f in doc.rootFrame().childFrames() if isinstance(f, QTextTable)]) == 1
        assert doc.toHtml() == fresh.toHtml() and _drawn(doc, 0) == _drawn(fresh, 0)


def test_a_document_catching_up_on_a_long_growing_table_takes_its_chunks_a_slice_a_call(qapp):
    """A document catching up a slice a call held the first chunks of a growing table only, which read as a table that
    had ended: they were joined into one, then taken out and put in again, and the document never caught up."""
    from app.core.growing_block import chunk_run
    from app.qt.stream_document import SafeDocument, StreamDocument

    renderer = MarkdownRenderer()
    text = "".join(f"## Part {i}\n\nSome words, *a few*.\n\n" for i in range(40)) + _table_text(150).split("\nAfter")[0]
    doc = SafeDocument()
    stream = StreamDocument(doc)
    for state, after in (("streaming", ""), ("streaming", "\nAfter it"), ("done", "\nAfter it")):
        rendered = message_html(Message(1, 1, None, "assistant", text + after, state), 1, 1, renderer, busy=state != "done")
        calls = 1
        while not stream.update(list(rendered.parts), budget=0.0) and calls < 100:
            calls += 1
        fresh = SafeDocument()
        fresh.setHtml(rendered.html)
        assert calls < 100 and doc.toHtml() == fresh.toHtml(), (state, after, calls)
        assert chunk_run(list(rendered.parts)) == (0 if after else 7)


def test_a_long_growing_table_s_chunks_take_its_widths_at_a_new_width_at_once(qapp):
    """The chunks took the table's widths at an update only: a chat opened while the table streams (its document filled
    before the view gives it a width) and a resized view drew chunks of other widths until the next token."""
    from app.core.growing_block import CHUNK_ROWS, chunk_run, chunk_tables, join_chunks
    from app.qt.stream_document import SafeDocument, StreamDocument

    parts = list(MarkdownRenderer().render_streaming_parts(_chunked_table(2 * CHUNK_ROWS + 12, 4))[0])
    run = chunk_run(parts)
    doc = SafeDocument()
    doc.setDocumentMargin(0)
    stream = StreamDocument(doc)  # the view keeps it while the answer streams
    stream.update(parts)
    for width in (500, 260):
        doc.setTextWidth(width)
        one = SafeDocument()
        one.setDocumentMargin(0)
        one.setTextWidth(width)
        one.setHtml("".join(parts[:-run]) + join_chunks(chunk_tables(parts[-run:])))
        assert _drawn(doc, 0) == _drawn(one, 0), width
