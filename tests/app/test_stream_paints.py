"""How often, and where, the chat view paints an answer while it streams."""
from __future__ import annotations

import time

from PySide6.QtCore import QCoreApplication

from app.qt.chat_view import MARGIN, MESSAGE_ROLE, PAD
from tests.app.helpers import hold_engine

ROWS = "".join(f"| Country {i} | City {i * 7 % 999} | {i * 104729:,} | Europe |\n" for i in range(60))
TABLE = "Here is the table:\n\n| Country | Capital | Population | Region |\n|---|---|---:|---|\n"


def _settle(seconds: float = 0.03) -> None:
    """The event loop runs until the update's layout, paints and the timers they start are done."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        QCoreApplication.processEvents()
        time.sleep(0.002)


def _stream_table(parley):
    """Sends a prompt with the engine held, streams a table's first 50 rows at once, then its last 10 a few characters
    an update; yields the streaming message's paints (their rows' heights and the document's) after each update."""
    w = parley.window
    w.resize(900, 600)
    hold_engine(parley, 5)
    assert w.chat.send("A table, please.")
    live = parley.service.live(w.current())
    sid, tid = live.session_id, live.turn.turn_id
    view = w.chat.view
    paints, real = [], type(view.delegate).paint

    def paint(painter, option, index):
        real(view.delegate, painter, option, index)
        msg = index.data(MESSAGE_ROLE)
        if msg is not None and msg.state == "streaming":
            doc, _ = view.delegate.document(msg)
            paints.append((option.rect.height(), int(doc.size().height()) + 2 * PAD + MARGIN))

    view.delegate.paint = paint
    head = TABLE + ROWS[:len(ROWS) * 5 // 6]
    parley.bridge.text_arrived.emit(sid, tid, head, 1)
    _settle(0.2)
    rest = ROWS[len(head) - len(TABLE):]
    for at in range(0, len(rest), 12):
        paints.clear()
        parley.bridge.text_arrived.emit(sid, tid, rest[at:at + 12], 3)
        _settle()
        yield list(paints)


def test_a_streaming_answer_is_laid_out_at_its_document_height_before_it_is_painted(parley):
    """Each token laid the streaming message out at the cheap size estimate of its Markdown (its document not brought
    up to date until its paint): a 200-row table ~1,200 px short, so it was drawn a screen away from its end, then
    laid out and drawn again at its height, then scrolled and drawn a third time."""
    updates = list(_stream_table(parley))
    assert len(updates) > 30 and all(updates)
    drawn = [p for paints in updates for p in paints]
    assert all(row == doc for row, doc in drawn), [p for p in drawn if p[0] != p[1]][:5]


def test_a_streaming_answer_is_painted_once_an_update(parley):
    """The status line's change with every token drew every message on screen again (it asks for that only so that a
    turn starting or ending shows or hides the links a busy chat refuses): the streaming message painted twice a token,
    the same document each time (a 200-row table's visible part: 2-4 ms a paint)."""
    updates = list(_stream_table(parley))
    painted = sum(len(paints) for paints in updates)
    assert len(updates) > 30 and painted <= 1.2 * len(updates), [len(paints) for paints in updates]



def test_a_streaming_answer_scrolled_out_of_view_keeps_the_height_of_its_document(parley):
    """A streaming answer off screen (the user scrolled up to read) was laid out at the size estimate of all of its
    Markdown, not at its document's height: a 34-row table 174 px short, which it jumped by when scrolled back into
    view. It keeps its document's height as last drawn, plus an estimate of the text since."""
    w, store = parley.window, parley.service.store
    w.resize(900, 600)
    conv = w.current()
    question = store.add_message(conv, None, "user", "An earlier question")
    store.add_message(conv, question.id, "assistant", "\n\n".join(f"Paragraph {i} of an earlier answer." for i in range(80)))
    w.open_chat(conv)
    hold_engine(parley, 5)
    assert w.chat.send("A table, please.")
    live = parley.service.live(conv)
    sid, tid, view = live.session_id, live.turn.turn_id, w.chat.view
    parley.bridge.text_arrived.emit(sid, tid, TABLE + ROWS[:len(ROWS) // 2], 1)
    _settle(0.2)
    view.verticalScrollBar().setValue(0)  # up to the earlier answer: the table is off screen
    _settle(0.1)
    row = view.model().rowCount() - 1
    rest = ROWS[len(ROWS) // 2:]
    for at in range(0, 48, 12):  # four rows while off screen
        parley.bridge.text_arrived.emit(sid, tid, rest[at:at + 12], 3)
        _settle()
    off_screen = view.visualRect(view.model().index(row, 0)).height()
    view.scrollToBottom()
    _settle(0.2)
    shown = view.visualRect(view.model().index(row, 0)).height()
    assert shown > 800 and abs(shown - off_screen) < 40, (off_screen, shown)
