"""The sidebar's search looks in the messages on a worker: each keystroke ran the search on the GUI thread (a common
phrase in 3,000 chats: 50-70 ms frozen a keystroke); the list shows only results for the text the box holds."""
from __future__ import annotations

import os
import random
import sqlite3
import threading

os.environ["QT_QPA_PLATFORM"] = "offscreen"

import pytest

from app.core import sqlite_store
from app.core.conversations import ConversationStore
from app.core.sqlite_store import SqliteConversationStore
from tests.app.helpers import chat_service

WORDS = "the weather was cold and the wind came over the hills while we talked about rain in the city".split()
CHATS = 300


@pytest.fixture
def sidebar(qtbot, tmp_path):
    """The real sidebar over the real store and chat service; the engine's and the models' signals never fire."""
    from app.qt.sidebar import Sidebar

    store, rng = SqliteConversationStore(tmp_path / "parley.db"), random.Random(3)
    with store.batch():
        for i in range(CHATS):
            conv = store.create(f"Chat {i} " + rng.choice(WORDS))
            question = store.add_message(conv.id, None, "user", " ".join(rng.choice(WORDS) for _ in range(12)))
            store.add_message(conv.id, question.id, "assistant", " ".join(rng.choice(WORDS) for _ in range(30)))
    bar = Sidebar(chat_service(store))
    qtbot.addWidget(bar)
    bar.show()
    yield bar
    bar._searcher.finish()  # nothing left on the worker when the store closes
    store.close()


def _expected(bar) -> list[int]:
    return [c.id for c in bar.service.visible(bar.search.text())]  # the store's own search, on this thread


def _settled(bar, qtbot) -> None:
    qtbot.waitUntil(lambda: not bar.searching(), timeout=10_000)


def test_typing_searches_messages_off_the_gui_thread_and_shows_only_the_text_in_the_box(sidebar, qtbot, monkeypatch):
    threads, shown, checking = [], [], []  # checking: the test's own search for the expected list, not recorded
    real_hits, real_scan = sqlite_store.message_hits, ConversationStore.search

    def recorded(real):
        return lambda *args: (checking or not args[1].strip() or threads.append(threading.current_thread()),
                              real(*args))[1]  # args[1]: the text looked for (none: every chat, nothing searched)
    monkeypatch.setattr(sqlite_store, "message_hits", recorded(real_hits))
    monkeypatch.setattr(ConversationStore, "search", recorded(real_scan))

    def expected() -> list[int]:
        checking.append(1)
        ids = _expected(sidebar)
        checking.clear()
        return ids
    real_show = sidebar._show
    sidebar._show = lambda convs: (real_show(convs), shown.append((sidebar.ids(), expected())))
    rng = random.Random(11)
    for text in ("the weather", "wind", "zz"):
        sidebar.search.clear()
        for ch in text:  # faster than a search at times: some keystrokes land while one is on the worker
            sidebar.search.insert(ch)
            qtbot.wait(rng.choice([0, 1, 5]))
        _settled(sidebar, qtbot)
        assert sidebar.ids() == expected() and sidebar.search.text() == text
    assert threads and threading.main_thread() not in threads  # every message search ran on the worker
    assert shown and all(ids == expected for ids, expected in shown)  # each list shown was right for the box then
    assert sidebar.ids() == []  # "zz" is in no chat


def test_chats_added_renamed_and_deleted_while_a_search_runs_are_right_when_it_lands(sidebar, qtbot, monkeypatch):
    service, store, release = sidebar.service, sidebar.service.store, threading.Event()
    real = sqlite_store.search_file
    monkeypatch.setattr(sqlite_store, "search_file", lambda *args: release.wait(10) and real(*args))
    sidebar.search.setText("rain")
    assert sidebar.searching()
    hits = [c.id for c in service.visible("rain")]
    new = service.new_conversation(title="New chat")
    store.add_message(new, None, "user", "will it rain")
    service.rename(hits[0], "Renamed")
    store.delete(hits[1])
    other = next(c.id for c in store.conversations() if c.id not in hits and c.id != new)
    service.rename(other, "Rainy days")
    release.set()
    _settled(sidebar, qtbot)
    ids = sidebar.ids()
    assert ids == _expected(sidebar) and new in ids and other in ids and hits[1] not in ids
    sidebar.search.setText("")
    assert sidebar.ids() == _expected(sidebar) and not sidebar.searching()  # no search: all chats at once


def test_a_search_back_after_more_typing_is_never_shown(sidebar, qtbot, monkeypatch):
    release, shown, real = threading.Event(), [], sqlite_store.search_file
    monkeypatch.setattr(sqlite_store, "search_file", lambda *args: release.wait(10) and real(*args))
    sidebar.search.setText("the")  # in nearly every chat; held on the worker until the box says "the zz"
    real_show = sidebar._show
    sidebar._show = lambda convs: (shown.append([c.id for c in convs]), real_show(convs))
    sidebar.search.setText("the zz")
    release.set()
    _settled(sidebar, qtbot)
    assert shown == [[]] and sidebar.ids() == [] == _expected(sidebar)  # "the" came back first: dropped


def test_a_search_typed_over_stops_on_the_worker(sidebar, qtbot, monkeypatch, tmp_path):
    """Each search ran to its end when typed over (a fast typist waited for every one: 190-315 ms after the last key
    for "the weather" in 3,000 chats, 110-210 ms stopped): the worker is told the text it looks for is gone."""
    asked, release, real = [], threading.Event(), sqlite_store.search_file
    monkeypatch.setattr(sqlite_store, "search_file",
                        lambda *args: asked.append(args) or release.wait(10) and real(*args))
    sidebar.search.setText("the")
    qtbot.waitUntil(lambda: len(asked) == 1)
    assert not asked[0][-1]()  # stale? not while the box says "the"
    sidebar.search.setText("the w")
    assert asked[0][-1]()
    release.set()
    _settled(sidebar, qtbot)
    assert [args[1] for args in asked] == ["the", "the w"] and not asked[1][-1]()
    path = sidebar.service.store.file
    assert real(path, "the", True, lambda: False) == {c.id for c in sidebar.service.store.conversations()}
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        real(path, "the", True, lambda: True)


def test_a_search_back_with_the_list_shown_touches_no_row(sidebar, qtbot):
    """Each search back walked every row (3,000: 12-26 ms of the GUI thread) though the list was the same."""
    sidebar.search.setText("the")
    _settled(sidebar, qtbot)
    touched, model = [], sidebar.model
    for signal in (model.rowsInserted, model.rowsRemoved, model.dataChanged, model.modelReset, model.layoutChanged):
        signal.connect(lambda *args: touched.append(args))
    sidebar.service.conversations_changed.emit()  # shown again at once from what was found, then looked for again
    _settled(sidebar, qtbot)
    assert touched == [] and sidebar.ids() == _expected(sidebar)
    first = model.index(0, 0)
    model.setData(first, " Renamed the ")  # renamed in the list: the title is stripped, the row shows it so
    _settled(sidebar, qtbot)
    assert touched and first.data() == sidebar.service.store.get(sidebar.ids()[0]).title == "Renamed the"


def test_a_search_stopped_for_a_text_typed_back_is_looked_for_again_on_the_worker(sidebar, qtbot, monkeypatch):
    """'the', 'the w', back to 'the': the search for 'the' was stopped (stale while the box said 'the w') and its
    error sent the search to the GUI thread."""
    release, threads, real = threading.Event(), [], sqlite_store.search_file

    def search_file(*args):
        threads.append(threading.current_thread())
        if len(threads) == 1:  # as search_file stops once told it is stale
            release.wait(10)
            raise sqlite3.OperationalError("interrupted")
        return real(*args)
    monkeypatch.setattr(sqlite_store, "search_file", search_file)
    scans, real_search = [], sqlite_store.SqliteConversationStore.search
    monkeypatch.setattr(sqlite_store.SqliteConversationStore, "search",
                        lambda self, text: scans.append(text) or real_search(self, text))
    sidebar.search.setText("the")
    sidebar.search.setText("the w")
    sidebar.search.setText("the")
    release.set()
    _settled(sidebar, qtbot)
    assert scans == [] and len(threads) == 2 and sidebar.ids() == _expected(sidebar)


def test_a_store_in_memory_is_searched_off_the_gui_thread_too(qtbot, monkeypatch):
    """A store without its file (another Parley holds the folder, a damaged file): every keystroke scanned every
    message on the GUI thread (16-28 ms for 3,000 chats)."""
    from app.core import conversations
    from app.qt.sidebar import Sidebar

    store, rng = ConversationStore(), random.Random(5)
    for i in range(CHATS):
        conv = store.create(f"Chat {i}")
        store.add_message(conv.id, None, "user", " ".join(rng.choice(WORDS) for _ in range(12)), state="done")
    store.add_message(conv.id, None, "assistant", "streaming about Zebras", state="streaming")
    bar = Sidebar(chat_service(store))
    qtbot.addWidget(bar)
    threads, real, real_search = [], conversations.scan_messages, ConversationStore.search
    monkeypatch.setattr(conversations, "scan_messages",
                        lambda *args: threads.append(threading.current_thread()) or real(*args))
    monkeypatch.setattr(ConversationStore, "search", lambda *_: pytest.fail("searched on the GUI thread"))
    for text in ("zebra", "wind", "c"):
        bar.search.setText(text)
        _settled(bar, qtbot)
        assert bar.ids() == [c.id for c in real_search(store, text)]  # as the store's own search finds them
    assert bar.ids() == [c.id for c in store.conversations()]  # "c": every title
    bar.search.setText("zebra")
    _settled(bar, qtbot)
    assert bar.ids() == [conv.id] and len(threads) == 4 and threading.main_thread() not in threads
    with pytest.raises(conversations.SearchStopped):
        real([(1, "a")], "a", lambda: True)
    bar._searcher.finish()


class _Counted:
    """A connection whose results count the rows taken from them."""

    def __init__(self, db: sqlite3.Connection):
        self.db, self.rows = db, 0

    def execute(self, *args):
        return _CountedRows(self, self.db.execute(*args))


class _CountedRows:
    def __init__(self, counted: _Counted, cursor: sqlite3.Cursor):
        self.counted, self.cursor = counted, cursor

    def __iter__(self):
        return self

    def __next__(self):
        row = next(self.cursor)
        self.counted.rows += 1
        return row

    def fetchone(self):
        self.counted.rows += 1
        return self.cursor.fetchone()


def test_the_index_search_hands_its_chats_back_in_one_row(sidebar):
    """A row a chat (2,858 for "the weather" in 3,000 chats) took the GIL back each time, waiting on the GUI thread: the
    worker's search took 87-188 ms beside a streaming chat, 45-63 ms in one row."""
    store = sidebar.service.store
    db = _Counted(sqlite3.connect(store.file))
    hits = sqlite_store.message_hits(db, "the", True)
    db.db.close()
    assert hits == {c.id for c in store.conversations()} and db.rows == 1
