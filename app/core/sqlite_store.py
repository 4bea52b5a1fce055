"""SqliteConversationStore: the ConversationStore kept in memory and written through to SQLite as it changes.

Structural changes (a chat, a message, a branch switch, a state change) are committed at once; streamed
text is committed at most every `flush_interval_s` and whenever the message's state changes. The store
belongs to one thread (the GUI's): sqlite3's same-thread check refuses a write from any other. When the
file cannot be written (read-only folder, full disk, damaged file) the store keeps working in memory and
sets `warning`, which the GUI shows.
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import shutil
import sqlite3
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

from app.core import schema
from app.core.checkpointer import Checkpointer
from app.core.held_changes import (HeldJournal, counted, forget_held, held_file, latest_updates, read_held, replay,
                                   save_held, set_aside)
from app.core.wal_files import left_open, unwritable_side_file
from app.core.chat_settings import ChatSettings
from app.core.conversations import Conversation, ConversationStore, Message

INTERRUPTED = "interrupted"  # an answer cut off by a crash or a kill; the GUI offers Continue and Regenerate
UNFINISHED = ("waiting", "queued", "streaming")
FTS_MIN_CHARS = 3  # the trigram index cannot match shorter needles
STALE_CHECK_STEPS = 1000  # a search given up asks whether it still matters this often (SQLite steps): 5-10 ms to stop
FULL_RETRY_S = 10.0  # while the disk is full, a write tries again at most this often (each try writes it all)
NEARLY_FULL = 1 << 20  # bytes free under which SQLite's "disk I/O error" means the disk is full
COMPACT_SHARE = 4  # closing compacts the file once the messages deleted since opening are a quarter of those left

_HELD: dict[str, list] = {}  # lock file -> [descriptor, stores of this process using it]

CONV_COLUMNS = "id, title, pinned, hidden, created_at, updated_at, leaf_id, settings_json"
MSG_COLUMNS = "id, conversation_id, parent_id, role, content, state, error, stats_json, model, created_at"


class SqliteConversationStore(ConversationStore):
    def __init__(self, path: str | Path, flush_interval_s: float = 0.5, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.file = Path(path)
        self.flush_interval_s = flush_interval_s
        self.warning = ""  # set once the store cannot write its file; chats still work in memory
        self.notice = ""  # what the window says once: changes held back when Parley last ran merged in, or kept at quit
        self.settings_notice = ""  # what the window says once: chats whose stored settings did not all read
        # chat id -> (its settings as read, their stored JSON) where some value did not read: the JSON is written back
        # as it was while the chat keeps those settings (every quit rewrote each chat's row with the defaults)
        self._kept_settings: dict[int, tuple[ChatSettings, str]] = {}
        self.kept: Path | None = None  # the file holding what a lock kept from being written at close
        self.on_warning: Callable[[str], None] | None = None
        self.on_commit: Callable[[list[Message]], None] | None = None  # messages just committed (tests, crash reports)
        self.recovered: list[int] = []  # answers found unfinished at open, now INTERRUPTED
        self.has_fts = False
        self._clock = clock
        self._last_flush = clock()
        self._dirty: set[int] = set()
        self._unfinished: set[int] = set()  # answers that were being written (a state of UNFINISHED): search_with's
        self._batch = 0
        self._batch_open = False  # the batch's transaction began (not while the file was locked)
        self._deleted = 0  # messages deleted since the file was opened (see _compact)
        self._held: list[tuple[str, tuple]] = []  # statements waiting while another program holds the write lock
        self._held_msgs: list[Message] = []
        self._journal = HeldJournal(self.file)  # the file beside it that `_held` is appended to as changes are held
        self._retry_at = 0.0  # clock time before which a full disk is not tried again
        self._full = False  # what is held waits for room on the disk, not for a lock
        self._blocked: Path | None = None  # what is held waits for this -wal or -shm file to be writable again
        self._held_why = ""  # why the changes the last run kept were held, as its file says
        self._compare: dict[int, list[int]] = {}
        self.models: dict[str, dict] = {}  # the model registry's rows (see app/core/sqlite_registry.py)
        self._db: sqlite3.Connection | None = None
        self._checkpoints: Checkpointer | None = None  # the WAL's checkpoints, off this thread
        self._lock_fd: str | None = None  # the key of the lock this store holds in _HELD
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file the connection has open
        self.locked_out = False  # another Parley holds this data folder: this one shows its chats read-only
        self._open()

    # -- opening
    def _open(self) -> None:
        if not self._lock():
            self.locked_out = True
            self._load_read_only(f"Parley is already open with the data folder {self.file.parent}; this window shows "
                                 "its chats read-only and saves nothing. Close the other Parley first.")
            return
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            db = schema.connect(self.file)
            _check_integrity(db)
            schema.migrate(db)
            self.has_fts = schema.ensure_search_index(db)
            merged = self._load_and_merge(db)
            self._use(db)
            self._recover()
            if merged:
                self._write_merged(merged)
        except schema.SchemaTooNewError as exc:
            self._load_read_only(f"{exc}. Chats are shown but changes will not be saved.")
        except sqlite3.DatabaseError as exc:
            if _is_damaged(exc):
                self._set_aside(exc)
            else:
                self._load_read_only(_why(exc, self.file))
        except OSError as exc:
            self._load_read_only(_why(exc, self.file))

    def _load_read_only(self, warning: str) -> None:
        """Shows what the file holds (when it can be read at all) and keeps every change in memory."""
        if self.file.is_file():
            try:
                db = schema.connect(self.file, read_only=True)
                if db.execute("PRAGMA user_version").fetchone()[0] >= 1:
                    self._load(db)
                db.close()
            except (sqlite3.Error, OSError):
                pass
        self._set_warning(warning)

    def _lock(self) -> bool:
        """An exclusive lock on the data folder, held while the store is open: two instances writing one file
        reuse ids and overwrite each other's changes. False when another process holds it; stores of this
        process share it (a restart simulated in tests, a store reopened after a crash report)."""
        try:
            import fcntl  # noqa: F401 (what _take_lock needs)
        except ImportError:  # Windows: SQLite's own locking is all there is
            return True
        key = str(self.file.resolve()) + ".lock"
        if key in _HELD:
            _HELD[key][1] += 1
            self._lock_fd = key
            return True
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return True  # a read-only folder: nothing will be written anyway
        free, fd = _take_lock(key)
        if fd is not None:
            _HELD[key] = [fd, 1]
            self._lock_fd = key
        return free

    def _lock_taken_since(self) -> bool:
        """True once another Parley has had the folder: its lock file was deleted (a "stale" lock cleared by hand) and
        a new one made since, by a Parley that may have written the file (and may be gone again). A lock file that is
        only missing is made and taken again."""
        key = self._lock_fd
        if key is None or key not in _HELD:
            return False
        try:
            return _identity(key) != _identity(_HELD[key][0])
        except FileNotFoundError:
            pass
        except OSError:
            return False
        free, fd = _take_lock(key)
        if fd is not None:
            os.close(_HELD[key][0])
            _HELD[key][0] = fd
        return not free

    def _unlock(self) -> None:
        key, self._lock_fd = self._lock_fd, None
        if key is None or key not in _HELD:
            return
        _HELD[key][1] -= 1
        if _HELD[key][1] == 0:
            os.close(_HELD.pop(key)[0])  # closing the descriptor releases the lock

    def _set_aside(self, exc: Exception) -> None:
        """A damaged file is renamed (never deleted) and a fresh one started, holding every chat that could still be
        read from the old one (so nothing on screen refers to rows the new file lacks)."""
        self._read_what_remains()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.file.with_name(f"{self.file.name}.damaged-{stamp}")
        try:
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(self.file) + suffix)
                if src.exists():
                    src.rename(Path(str(aside) + suffix))
            self._start_file()
        except (sqlite3.Error, OSError) as exc2:
            self._set_warning(_why(exc2, self.file))
            return
        self._write(self._everything())
        self._set_warning(f"The chat database was damaged ({exc}); it was kept as {aside.name} and a new one started.")

    def _start_file(self) -> None:
        """A new, empty database at `self.file`, open for writing."""
        db = schema.connect(self.file)
        schema.migrate(db)
        self.has_fts = schema.ensure_search_index(db)
        self._use(db)

    def _use(self, db: sqlite3.Connection) -> None:
        """`db`, open on `self.file`, is the connection the store writes through from now on."""
        self._db, self._identity = db, _identity(self.file)
        # another program's write lock is found at once, not after the busy timeout's 2 s on the GUI thread: the changes
        # are held and the next change or flush tries again, at no cost
        db.execute("PRAGMA busy_timeout = 0")
        self._checkpoints = Checkpointer(self.file)
        self._checkpoints.attach(db)

    def _let_go(self) -> sqlite3.Connection | None:
        """The store's connection, no longer the store's (the caller closes it or leaves it open); None where none."""
        if self._checkpoints is not None:
            self._checkpoints.close()  # a checkpoint running ends before the file is closed, moved or written anew
            self._checkpoints = None
        db, self._db = self._db, None
        return db

    def _file_is_gone(self) -> bool:
        """The file was deleted, moved or replaced since it was opened: SQLite goes on writing to the old one."""
        try:
            return _identity(self.file) != self._identity
        except FileNotFoundError:
            return True
        except OSError:
            return False  # cannot tell (a folder without search permission): the open file stays in use

    def _after_file_gone(self) -> None:
        """Lets go of the old file, its WAL emptied first: left beside a file that took its name, SQLite read the WAL
        into that file at the next start. A file deleted or moved away is written anew from memory; a replacing one
        (a backup put back) is left as it is."""
        db = self._let_go()
        if self._held:  # what memory holds, written anew below, has them: replayed later they would undo newer text
            self._held, self._held_msgs = [], []
            forget_held(self.file)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
        except (sqlite3.Error, OSError):
            pass
        if self.file.exists():
            self._set_warning(f"{self.file} was replaced while Parley ran; it is left as it is, and changes are kept "
                              "in memory until Parley quits.")
            return
        try:
            for suffix in ("-wal", "-shm"):  # the old file's, emptied: a new file starts without them
                Path(str(self.file) + suffix).unlink(missing_ok=True)
            self._start_file()
        except (sqlite3.Error, OSError) as exc:
            self._set_warning(_why(exc, self.file))
            return
        self._write(self._everything())
        self._set_warning(f"The chat database {self.file} was deleted or moved while Parley ran; a new one was "
                          "started with the chats shown.")

    def _everything(self) -> list[tuple[str, tuple]]:
        """What memory holds (chats, messages, imported models, comparisons) as the statements that write it into an
        empty file."""
        now = time.time()  # models are listed in the order they were added: kept by a microsecond apart
        return ([(f"INSERT INTO conversation ({CONV_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                  _conv_row(c, self._kept_settings.get(c.id))) for c in self._conversations.values()] +
                [(f"INSERT INTO message ({MSG_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", _msg_row(m))
                 for m in sorted(self._messages.values(), key=lambda m: m.id)] +
                [("INSERT INTO model (key, name, path, kind, added_at) VALUES (?, ?, ?, ?, ?)",
                  (m["key"], m["name"], m["path"], m["kind"], now + i / 1e6))
                 for i, m in enumerate(self.models.values())] +
                [row for gid, members in self._compare.items() for row in _compare_rows(gid, members, now)])

    def _read_what_remains(self) -> None:
        """Starts over from empty (a failed load leaves half its rows) and reads every row the damaged file still
        gives, keeping the tree consistent (parents before children, leaves that exist)."""
        self._conversations.clear()
        self._messages.clear()
        self._children.clear()
        self._compare.clear()
        self.models.clear()
        try:
            db = schema.connect(self.file, read_only=True)
            try:
                self._load(db)
            finally:
                db.close()
        except (sqlite3.Error, OSError):
            pass  # what was read before the damage stays
        self._reorder()
        for conv in self._conversations.values():
            if conv.leaf_id is not None and conv.leaf_id not in self._messages:
                conv.leaf_id = None
        self._compare.clear()  # not carried over to the new file
        self._ids = itertools.count(max([0, *self._conversations, *self._messages]) + 1)

    def _load_and_merge(self, db: sqlite3.Connection) -> int:
        """Loads the file with the changes a lock held back when Parley last ran applied (they wait in `_held` to be
        written); returns how many there were."""
        statements = self._read_held()
        if not statements:
            self._load(db)
            return 0
        merged, applied = replay(db, statements)
        try:
            self._load(merged)
        finally:
            merged.close()
        self._held = applied
        return len(statements)

    def _read_held(self) -> list[tuple[str, tuple]]:
        """What a lock held back when Parley last ran. A file that does not read was ignored without a word and then
        written over: it is kept aside, renamed, and the window says so once."""
        try:
            statements, self._held_why = read_held(self.file)
            return statements
        except (OSError, ValueError) as exc:
            why = str(exc) if isinstance(exc, OSError) else "cut short or damaged"
            try:
                kept = f"it was kept as {set_aside(self.file).name}"
            except OSError:
                kept = f"it is left as {held_file(self.file).name}"
            self.notice = (f"The changes held back when Parley last ran ({held_file(self.file).name}) could not be read "
                           f"({why}); {kept}.")
            return []

    def _write_merged(self, count: int) -> None:
        """Says what the last run held back, why (what its file says: a lock, a full disk, a -wal or -shm that could
        not be written; every one read 'another program had parley.db locked'), and what saves them if they wait."""
        if self._held:
            self._write([])
        where = self._held_why or "they could not be written then"
        changes, are = counted(count)
        self.notice = (f"{changes} held back when Parley last ran ({where}) {are} saved now." if self.persistent else
                       f"{changes} held back when Parley last ran ({where}) {are} shown, and saved once "
                       f"{self._until()}.")
        if self.persistent:
            forget_held(self.file)

    def _load(self, db: sqlite3.Connection) -> None:
        top = 0
        read: dict[str, tuple[ChatSettings, list[str]]] = {}  # settings JSON -> its settings: most chats share a few
        unread: list[str] = []
        for row in db.execute(f"SELECT {CONV_COLUMNS} FROM conversation ORDER BY id"):
            conv, missed = _conversation(row, read)
            self._conversations[conv.id] = conv
            top = max(top, conv.id)
            if missed:
                self._kept_settings[conv.id] = (copy.copy(conv.settings), row[-1])
                unread.append(f"“{conv.title[:40]}”: {'; '.join(missed)}")
        self.settings_notice = _settings_notice(unread)
        for row in db.execute(f"SELECT {MSG_COLUMNS} FROM message ORDER BY id"):
            msg = _message(row)
            top = max(top, msg.id)  # a row skipped below keeps its id in the file: never given out again
            if not _fits(msg, self._conversations, self._messages):
                continue  # skipped rather than shown detached
            self._messages[msg.id] = msg
            self._children.setdefault((msg.conversation_id, msg.parent_id), []).append(msg.id)
            if msg.state in UNFINISHED:
                self._unfinished.add(msg.id)
        for conv in self._conversations.values():
            if conv.leaf_id is not None and conv.leaf_id not in self._messages:
                conv.leaf_id = None
        if _has_table(db, "compare_member"):
            for gid, cid in db.execute("SELECT group_id, conversation_id FROM compare_member ORDER BY group_id, position"):
                self._compare.setdefault(gid, []).append(cid)
            for key, name, path, kind in db.execute("SELECT key, name, path, kind FROM model ORDER BY added_at, key"):
                self.models[key] = {"key": key, "name": name, "path": path, "kind": kind}
            top = max([top, *self._compare])
        self._ids = itertools.count(top + 1)
        self._reorder()

    def _recover(self) -> None:
        """Answers that were being generated when the app died: kept, marked interrupted."""
        cut = [m for m in self._messages.values() if m.state in UNFINISHED]
        for msg in cut:
            msg.state = INTERRUPTED
            if msg.error.startswith("Queued"):
                msg.error = ""
        self.recovered = [m.id for m in cut]
        if cut:
            self._write([_update_msg(m) for m in cut], cut)

    # -- writing
    def _write(self, statements: list[tuple[str, tuple]], committed: list[Message] = ()) -> None:
        if self._db is None:
            return
        if self._batch:
            self._write_in_batch(statements)
            return
        if not self._file_still_ours():
            if self._db is not None and self.on_commit is not None and committed:  # written anew from memory
                self.on_commit(list(committed))
            return
        statements, committed = [*self._held, *statements], [*self._held_msgs, *committed]
        self._blocked = unwritable_side_file(self.file)  # before SQLite writes into it: a mapped -shm raises SIGBUS
        if self._blocked is not None:
            self._hold(statements, committed)
            return
        try:
            if not self._begin():
                self._hold(statements, committed)
                return
            for sql, params in statements:
                self._db.execute(sql, params)
            self._db.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            if _is_full(exc, self.file):
                self._wait_for_room(statements, committed)
            else:
                self._degrade(exc)
            return
        self._checkpoints.after_commit()
        self._saved_again()
        if self.on_commit is not None and committed:
            self.on_commit(list(committed))

    def _write_in_batch(self, statements: list[tuple[str, tuple]]) -> None:
        if not self._batch_open:  # the file was locked when the batch began
            self._held.extend(statements)
            self._warn_locked()
            return
        try:
            for sql, params in statements:
                self._db.execute(sql, params)
        except (sqlite3.Error, OSError) as exc:
            self._degrade(exc)

    def _file_still_ours(self) -> bool:
        """False where the file cannot be written as it is: another Parley took the folder (this one stops), or the
        file was deleted, moved or replaced (written anew from memory, or left as it is)."""
        if self._lock_taken_since():
            self.locked_out = True
            self._degrade(f"Another Parley opened the data folder {self.file.parent} after its lock file was deleted; "
                          "this one saves nothing more (its chats are kept in memory until it quits).")
            return False
        if self._file_is_gone():
            self._after_file_gone()
            return False
        return True

    def _begin(self) -> bool:
        """BEGIN IMMEDIATE, or False while another program (a database browser) holds the write lock: the changes wait
        for a later write. Giving up for good lost the rest of the session; a try does not wait (busy timeout 0: it
        waited 2 s on the GUI thread, once every 10 s while the lock was held)."""
        if self._clock() < self._retry_at:
            return False
        try:
            self._db.execute("BEGIN IMMEDIATE")
            return True
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc).lower():
                raise
        self._full = False
        return False

    def _wait_for_room(self, statements: list[tuple[str, tuple]], committed: list[Message]) -> None:
        """A full disk: the changes are held as for a lock and written once there is room. The store stopped writing
        for the rest of the session instead: a streamed answer, and all after it, were lost at quit even when space
        had been freed meanwhile."""
        try:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except (sqlite3.Error, OSError):
            pass
        self._full = True
        self._retry_at = self._clock() + FULL_RETRY_S
        self._hold(statements, committed)

    def _hold(self, statements: list[tuple[str, tuple]], committed: list[Message]) -> None:
        held = latest_updates(statements)
        changed = held != self._held  # the window's flush timer tries again every second with nothing new
        self._held, self._held_msgs = held, list(committed)
        if changed:
            self._keep_current()
        self._warn_locked()

    def _keep_current(self) -> None:
        """The held changes' file follows them as they are held, not only at a clean quit: a crash or a kill while the
        file was locked lost them all. Unsynced and appended to (held_changes.HeldJournal: 0.03-0.25 ms a change at
        0.1-10 MB held, where rewriting it whole took 0.5-45 ms; synced, 12-16 ms more on the GUI thread), at most once
        a flush interval while text streams; the quit's copy is written whole and synced."""
        try:
            self._journal.keep(self._held, self._why_held())
        except OSError:
            pass  # a full disk, say: they are still held here and kept (or said to be lost) at quit

    def _warn_locked(self) -> None:
        if self._held and self.warning != self._locked_text():  # once held: the GUI reads `persistent` as it shows it
            self._set_warning(self._locked_text())

    def _saved_again(self) -> None:
        if self._held:
            self._held, self._held_msgs = [], []
            forget_held(self.file)  # what was kept there is written now
            if self.warning == self._locked_text():
                self._set_warning("")  # the window's "not saving" goes: the held changes are written
        self._full = False

    def _why_held(self) -> str:
        """Why the changes are held, as the next start says it."""
        if self._blocked is not None:
            return f"{self._blocked.name} could not be written"
        if self._full:
            return f"the disk was full where {self.file.name} is kept"
        return f"another program had {self.file.name} locked"

    def _until(self) -> str:
        if self._blocked is not None:
            return f"{self._blocked.name} can be written again (it is read-only or immutable: chattr -i clears that)"
        if self._full:
            return "there is room on the disk"
        return f"the other program lets go of {self.file.name}"

    def _locked_text(self) -> str:
        if self._blocked is not None:
            return (f"{self._blocked} cannot be written (made read-only or immutable): chats are not saved until it "
                    f"can be, and what is not saved is kept beside {self.file.name} at quit.")
        if self._full:
            return (f"The disk is full where {self.file} is kept: chats are not saved until there is room (Parley "
                    f"tries again every {FULL_RETRY_S:.0f} s).")
        return (f"Another program has {self.file} locked: chats are not saved until it lets go, and are saved as soon "
                "as it does.")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Groups many changes (an import) into one transaction; held, as any change, while the file is locked."""
        if self._batch == 0:
            self._batch_open = self._open_batch()
        self._batch += 1
        try:
            yield
        finally:
            self._batch -= 1
            if self._batch == 0 and self._batch_open and self._db is not None:
                try:
                    self._db.execute("COMMIT")
                    self._checkpoints.after_commit()
                    self._saved_again()
                except (sqlite3.Error, OSError) as exc:
                    self._degrade(exc)
            elif self._batch == 0 and self._held:
                self._keep_current()  # once for the whole batch held back, not once a statement

    def _open_batch(self) -> bool:
        """Begins the batch's transaction with the changes held so far; False where it cannot begin."""
        if self._db is not None:
            self._file_still_ours()  # a file written anew from memory is the one the batch goes to
        if self._db is None:
            return False
        self._blocked = unwritable_side_file(self.file)
        try:
            if self._blocked is not None or not self._begin():
                return False
            for sql, params in self._held:
                self._db.execute(sql, params)
            return True
        except (sqlite3.Error, OSError) as exc:
            self._degrade(exc)
            return False

    def _degrade(self, exc: Exception | str) -> None:
        db = self._let_go()
        if db is not None and unwritable_side_file(self.file) is not None:
            left_open(db)
        elif db is not None:
            try:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                db.close()
            except (sqlite3.Error, OSError):
                pass
        self._set_warning(exc if isinstance(exc, str) else _why(exc, self.file))

    def _set_warning(self, text: str) -> None:
        self.warning = text
        if self.on_warning is not None:
            self.on_warning(text)

    @property
    def persistent(self) -> bool:
        return self._db is not None and not self._held

    @property
    def holding(self) -> bool:
        """Changes wait for the file to take them (a lock, a full disk, a side file not writable): each change held
        is appended to the file that keeps them."""
        return self._db is not None and bool(self._held)

    def flush(self) -> None:
        """Commits the text streamed since the last flush (the GUI also calls this on a timer)."""
        self._last_flush = self._clock()
        if not self._dirty and not self._held:
            return
        msgs = [self._messages[i] for i in sorted(self._dirty) if i in self._messages]
        self._dirty.clear()
        self._write([_update_msg(m) for m in msgs], msgs)

    def snapshot(self) -> sqlite3.Connection | None:
        """A read-only connection of its own that sees the file as it is now, whatever this store writes after (a read
        transaction under WAL), for one other thread to read chats from (snapshot_store) and close; None where the file
        does not hold all that is shown (changes held back or failed, a store in memory only, a file replaced)."""
        self.flush()
        if self._db is None or self._batch or self._held or self._dirty or not self._file_still_ours():
            return None
        db = None
        try:  # never immutable=1 (schema.connect's fallback): that reads a file being written as if it were not
            db = sqlite3.connect(f"{self.file.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None,
                                 check_same_thread=False)  # made here, used there, one thread at a time
            db.execute(f"PRAGMA busy_timeout = {schema.BUSY_TIMEOUT_MS}")
            db.execute("BEGIN")
            db.execute("SELECT count(*) FROM conversation").fetchone()  # the view is fixed at the first read
            return db
        except (sqlite3.Error, OSError):
            if db is not None:
                db.close()
            return None

    def close(self) -> None:
        """Commits everything and closes the file; the store keeps working in memory afterwards."""
        self._retry_at = 0.0  # the last chance to write what a lock held back
        if self._db is not None:  # the window is gone: a lock let go within the busy timeout takes them into the file
            self._db.execute(f"PRAGMA busy_timeout = {schema.BUSY_TIMEOUT_MS}")
        self.flush()
        self._write([self._update_conv(c) for c in self._conversations.values()])
        if self._held and self._db is not None:
            self._keep_held()
        db = self._let_go()
        if db is not None and unwritable_side_file(self.file) is not None:
            left_open(db)
        elif db is not None:
            try:
                self._compact(db)
                db.execute("PRAGMA optimize")
                db.close()
            except (sqlite3.Error, OSError):
                pass
        self._unlock()

    def _keep_held(self) -> None:
        """The file is still locked at quit: what it held back goes to a file beside it, merged in at the next start
        (quitting lost the last messages)."""
        changes, are = counted(len(self._held))
        name = self.file.name
        why = f"The disk is full where {name} is kept" if self._full else f"Another program has {name} locked"
        if self._blocked is not None:
            why = f"{self._blocked.name} could not be written"
        try:
            self.kept = save_held(self.file, self._held, why=self._why_held())
        except OSError as exc:
            self.notice = f"{why}: {changes} {are} lost ({exc})."
            return
        self.notice = f"{why}: {changes} not yet saved {are} kept in {self.kept.name} and saved at the next start."

    def _compact(self, db: sqlite3.Connection) -> None:
        """Gives deleted chats' space back: SQLite only marks their pages free and the search index only records their
        removal, so the file never shrank (27 MB after deleting 1,001 of 2,001 chats; 11.8 MB compacted)."""
        if not self._deleted or self._deleted * COMPACT_SHARE < len(self._messages):
            return
        try:
            if self.has_fts:
                db.execute("INSERT INTO message_fts(message_fts) VALUES ('optimize')")  # merges away the removal records
            db.execute("VACUUM")
        except (sqlite3.Error, OSError):
            pass  # a full disk, say: the space stays taken, nothing is lost

    # -- conversations
    def create(self, title: str = "New chat", settings: ChatSettings | None = None, hidden: bool = False) -> Conversation:
        conv = super().create(title, settings, hidden)
        self._write([(f"INSERT INTO conversation ({CONV_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _conv_row(conv))])
        return conv

    def update(self, conv_id: int, **changes) -> Conversation:
        conv = super().update(conv_id, **changes)
        if "settings" in changes:  # the user's own choice replaces what did not read
            self._kept_settings.pop(conv_id, None)
        self._write([self._update_conv(conv)])
        return conv

    def _update_conv(self, c: Conversation) -> tuple[str, tuple]:
        row = _conv_row(c, self._kept_settings.get(c.id))
        return ("UPDATE conversation SET title = ?, pinned = ?, hidden = ?, created_at = ?, updated_at = ?, leaf_id = ?, "
                "settings_json = ? WHERE id = ?", (*row[1:], row[0]))

    def delete(self, conv_id: int) -> None:
        self._dirty = {i for i in self._dirty if self._messages[i].conversation_id != conv_id}
        before = len(self._messages)
        super().delete(conv_id)
        self._deleted += before - len(self._messages)
        for gid in [g for g, members in self._compare.items() if conv_id in members]:
            self._compare[gid].remove(conv_id)
        self._write([("DELETE FROM message WHERE conversation_id = ?", (conv_id,)),
                     ("DELETE FROM conversation WHERE id = ?", (conv_id,))])

    def search(self, text: str) -> list[Conversation]:
        """Title or message text contains `text`, case-insensitive: FTS5 (trigram) when it can, memory otherwise."""
        needle = text.strip()
        if self._db is None or not self.has_fts or len(needle) < FTS_MIN_CHARS:
            return super().search(text)
        self.flush()
        try:
            hits = message_hits(self._db, needle)
        except sqlite3.Error:
            return super().search(text)
        return self.search_with(text, hits)

    def message_search(self, text: str) -> Callable[[Callable[[], bool]], set[int]] | None:
        """A search for `text` that another thread can run (search_file; its argument: whether the answer is no longer
        wanted), what it finds then right for this store (search_with); where the file does not hold all that is shown
        (changes held back or failed, a file replaced, a store in memory only), a scan of the messages in memory."""
        self.flush()
        if self._db is None or self._batch or self._held or self._dirty or not self._file_still_ours():
            return super().message_search(text)
        return partial(search_file, self.file, text, self.has_fts)

    def search_with(self, text: str, hits: set[int]) -> list[Conversation]:
        """search(text) given `hits`, the chats whose finished messages hold it (as message_hits found them): titles
        and answers still being written are looked at here, against the chats as they are now."""
        folded = text.strip().casefold()
        if not folded:
            return self.conversations()
        hits = hits | self._unfinished_with(folded)
        return [c for c in self.conversations() if c.id in hits or folded in c.title.casefold()]

    def _unfinished_with(self, folded: str) -> set[int]:
        """Chats whose answer still being written holds `folded`: the index takes an answer once it ends (schema.py).
        Those of the answers kept as begun that are still being written are looked at (every message was: 1.3-1.7 ms
        at 20,000 chats); the others are forgotten here, whoever ended them."""
        msgs = self._messages
        self._unfinished = {i for i in self._unfinished if i in msgs and msgs[i].state in UNFINISHED}
        return {msgs[i].conversation_id for i in self._unfinished if folded in msgs[i].content.casefold()}

    # -- messages
    def add_message(self, conv_id: int, parent_id: int | None, role: str, content: str = "", state: str = "done") -> Message:
        msg = super().add_message(conv_id, parent_id, role, content, state)
        if state in UNFINISHED:
            self._unfinished.add(msg.id)
        self._dirty.discard(msg.id)
        self._write([(f"INSERT INTO message ({MSG_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", _msg_row(msg)),
                     self._update_conv(self._conversations[conv_id])], [msg])
        return msg

    def delete_message(self, msg_id: int) -> list[int]:
        conv = self._conversations[self._messages[msg_id].conversation_id]
        leaf = conv.leaf_id
        gone = super().delete_message(msg_id)
        self._deleted += len(gone)
        self._dirty.difference_update(gone)
        self._unfinished.difference_update(gone)
        moved = [self._update_conv(conv)] if conv.leaf_id != leaf else []
        self._write([*(("DELETE FROM message WHERE id = ?", (mid,)) for mid in gone), *moved])
        return gone

    def update_message(self, msg_id: int, **changes) -> Message:
        msg = super().update_message(msg_id, **changes)
        if msg.state in UNFINISHED:
            self._unfinished.add(msg_id)
        self._dirty.add(msg_id)
        self.flush()
        return msg

    def append_text(self, msg_id: int, text: str) -> Message:
        msg = super().append_text(msg_id, text)
        self._dirty.add(msg_id)
        if self._clock() - self._last_flush >= self.flush_interval_s:
            self.flush()
        return msg

    def select(self, msg_id: int) -> None:
        super().select(msg_id)
        self._write([self._update_conv(self._conversations[self._messages[msg_id].conversation_id])])

    def set_leaf(self, conv_id: int, msg_id: int | None) -> None:
        super().set_leaf(conv_id, msg_id)
        self._write([self._update_conv(self._conversations[conv_id])])

    # -- compare groups: the columns of one side-by-side comparison, in order
    def add_compare_group(self, conv_ids: list[int], title: str = "") -> int:
        gid = next(self._ids)
        self._compare[gid] = list(conv_ids)
        self._write(_compare_rows(gid, conv_ids, time.time(), title))
        return gid

    def compare_groups(self) -> dict[int, list[int]]:
        return {g: list(m) for g, m in self._compare.items() if m}

    def set_compare_members(self, group_id: int, conv_ids: list[int]) -> None:
        """The group's columns now (added, removed or replaced), in order."""
        self._compare[group_id] = list(conv_ids)
        self._write([("DELETE FROM compare_member WHERE group_id = ?", (group_id,)),
                     *[("INSERT INTO compare_member (group_id, conversation_id, position) VALUES (?, ?, ?)", (group_id, c, i))
                       for i, c in enumerate(conv_ids)]])

    def delete_compare_group(self, group_id: int) -> None:
        self._compare.pop(group_id, None)
        self._write([("DELETE FROM compare_group WHERE id = ?", (group_id,))])

    # -- model registry rows
    def save_model(self, key: str, name: str, path: str, kind: str) -> None:
        self.models[key] = {"key": key, "name": name, "path": path, "kind": kind}
        self._write([("INSERT OR REPLACE INTO model (key, name, path, kind, added_at) VALUES (?, ?, ?, ?, ?)",
                      (key, name, path, kind, time.time()))])

    def remove_model(self, key: str) -> None:
        self.models.pop(key, None)
        self._write([("DELETE FROM model WHERE key = ?", (key,))])


def message_hits(db: sqlite3.Connection, needle: str, indexed: bool = True) -> set[int]:
    """The chats whose finished messages hold `needle`, case-insensitive: by the trigram index where it can (`indexed`
    and FTS_MIN_CHARS or more), else by reading every finished message."""
    needle = needle.strip()
    if indexed and len(needle) >= FTS_MIN_CHARS:
        query = '"' + needle.replace('"', '""') + '"'
        # one row, not one a chat: each row fetched takes the GIL back, waiting on the GUI thread each time
        ids = db.execute("SELECT group_concat(DISTINCT m.conversation_id) FROM message_fts f JOIN message m "
                         "ON m.id = f.rowid WHERE message_fts MATCH ?", (query,)).fetchone()[0]
        return {int(i) for i in ids.split(",")} if ids else set()
    else:
        db.create_function("casefold", 1, _casefold, deterministic=True)  # as the store in memory folds
        rows = db.execute("SELECT DISTINCT conversation_id FROM message WHERE state NOT IN "
                          f"{schema.UNFINISHED} AND instr(casefold(content), ?) > 0", (needle.casefold(),))
        return {row[0] for row in rows}


def search_file(path: Path, needle: str, indexed: bool = True, stale: Callable[[], bool] | None = None) -> set[int]:
    """message_hits on a read-only connection of the calling thread's own (the sidebar's searches, off the GUI
    thread: 20-50 ms a keystroke for a common phrase in 3,000 chats); raises sqlite3.Error where the file cannot, or
    once `stale()` says nobody waits for the answer any more (typed on: the next search starts a few ms later)."""
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    try:
        db.execute(f"PRAGMA busy_timeout = {schema.BUSY_TIMEOUT_MS}")
        if stale is not None:
            db.set_progress_handler(lambda: int(stale()), STALE_CHECK_STEPS)
        return message_hits(db, needle, indexed)
    finally:
        db.close()


def _casefold(text: str | None) -> str:
    return (text or "").casefold()


def snapshot_store(db: sqlite3.Connection, conv_ids: list[int] | None = None) -> ConversationStore:
    """The chats a snapshot connection sees (those of `conv_ids`, or all), as a store in memory read as the window's own
    store reads its file; closes the connection."""
    store, read = ConversationStore(), {}
    where = "" if conv_ids is None else f" WHERE id IN ({', '.join('?' * len(conv_ids))})"
    try:
        for row in db.execute(f"SELECT {CONV_COLUMNS} FROM conversation{where}", conv_ids or ()):
            conv = _conversation(row, read)[0]
            store._conversations[conv.id] = conv
        where = where.replace("id IN", "conversation_id IN")
        for row in db.execute(f"SELECT {MSG_COLUMNS} FROM message{where} ORDER BY id", conv_ids or ()):
            msg = _message(row)
            if _fits(msg, store._conversations, store._messages):
                store._messages[msg.id] = msg
                store._children.setdefault((msg.conversation_id, msg.parent_id), []).append(msg.id)
    finally:
        db.close()
    store._reorder()
    for conv in store._conversations.values():
        if conv.leaf_id is not None and conv.leaf_id not in store._messages:
            conv.leaf_id = None
    return store


# -- rows <-> objects
def _clean(text: str) -> str:
    """SQLite stores UTF-8: a lone surrogate (from a paste or a bad import) is saved as '?'."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def _conv_row(c: Conversation, kept: tuple[ChatSettings, str] | None = None) -> tuple:
    """`kept`: the settings as read and their stored JSON, written back as it was while the chat keeps them."""
    stored = kept[1] if kept is not None and kept[0] == c.settings else _clean(json.dumps(c.settings.to_dict()))
    return (c.id, _clean(c.title), int(c.pinned), int(c.hidden), c.created_at, c.updated_at, c.leaf_id, stored)


def _msg_row(m: Message) -> tuple:
    stats = _json(m.stats)
    return (m.id, m.conversation_id, m.parent_id, m.role, _clean(m.content), m.state, _clean(m.error), stats,
            _clean(m.model), m.created_at)


def _update_msg(m: Message) -> tuple[str, tuple]:
    stats = _json(m.stats)
    return ("UPDATE message SET content = ?, state = ?, error = ?, stats_json = ?, model = ?, created_at = ? WHERE id = ?",
            (_clean(m.content), m.state, _clean(m.error), stats, _clean(m.model), m.created_at, m.id))


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, default=str)


def _conversation(row: tuple, read: dict[str, tuple[ChatSettings, list[str]]]) -> tuple[Conversation, list[str]]:
    """The chat, and its stored settings' values that did not read. `read`: settings already read this load, by their
    JSON; reading them validates every field apart (1.4 ms a chat: 2.8 s of opening 2,000 chats), and each chat gets
    its own copy."""
    cid, title, pinned, hidden, created, updated, leaf, settings_json = row
    if settings_json not in read:
        read[settings_json] = _settings(settings_json)
    settings, unread = read[settings_json]
    return Conversation(cid, title, copy.copy(settings), bool(pinned), bool(hidden), leaf, created, updated), unread


def _settings(settings_json: str) -> tuple[ChatSettings, list[str]]:
    unread: list[str] = []
    try:
        data = json.loads(settings_json)
    except (ValueError, TypeError):
        data = None
    if not isinstance(data, dict):
        return ChatSettings(), ["the settings as a whole (not an object)"]
    return ChatSettings.readable(data, unread), unread  # what this version cannot read: the defaults


def _settings_notice(unread: list[str]) -> str:
    """One line for the chats whose stored settings did not all read."""
    if not unread:
        return ""
    shown = "; ".join(unread[:2]) + (f"; and {len(unread) - 2} more" if len(unread) > 2 else "")
    chats = f"{len(unread)} chat{'s' * (len(unread) > 1)}"
    return (f"Settings of {chats} did not read: the defaults are used until you change them, and what is stored is "
            f"kept: {shown}.")


def _message(row: tuple) -> Message:
    mid, cid, parent, role, content, state, error, stats_json, model, created = row
    try:
        stats = json.loads(stats_json) if stats_json else None
    except ValueError:
        stats = None
    return Message(mid, cid, parent, role, content, state, error, stats, model, created)


def _fits(msg: Message, convs: dict[int, Conversation], msgs: dict[int, Message]) -> bool:
    """`msg` belongs in the chats read so far: its chat is there, and its parent in that chat (a file without foreign
    keys, or a hand-edited one, may say otherwise)."""
    if msg.conversation_id not in convs:
        return False
    parent = msgs.get(msg.parent_id)
    return msg.parent_id is None or (parent is not None and parent.conversation_id == msg.conversation_id)


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def _compare_rows(gid: int, members: list[int], created: float, title: str = "") -> list[tuple[str, tuple]]:
    return [("INSERT INTO compare_group (id, title, created_at) VALUES (?, ?, ?)", (gid, title, created)),
            *[("INSERT INTO compare_member (group_id, conversation_id, position) VALUES (?, ?, ?)", (gid, c, i))
              for i, c in enumerate(members)]]


def _identity(path: Path | str | int) -> tuple[int, int]:
    st = os.stat(path)  # a path, or an open descriptor
    return st.st_dev, st.st_ino


def _take_lock(key: str) -> tuple[bool, int | None]:
    """(False, None) where another process holds the lock file `key`; (True, its descriptor) once this one does; (True,
    None) where none can be had (a read-only folder; a file system without locks, ENOLCK on some network mounts):
    unguarded, as on Windows."""
    import fcntl  # the callers checked it is there

    try:
        fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return True, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        return not isinstance(exc, BlockingIOError), None
    return True, fd


def _check_integrity(db: sqlite3.Connection) -> None:
    """Damage anywhere in the file (its last page too) is found at open, not when a chat touches it later."""
    verdict = db.execute("PRAGMA quick_check(1)").fetchone()[0]
    if verdict != "ok":
        raise sqlite3.DatabaseError(f"database disk image is malformed: {verdict}")


def _is_damaged(exc: Exception) -> bool:
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text or "corrupt" in text


def _nearly_full(folder: Path) -> bool:
    """Opening on a full disk fails growing the WAL index, which SQLite reports as a plain "disk I/O error"."""
    try:
        return shutil.disk_usage(folder).free < NEARLY_FULL
    except OSError:
        return False


def _is_full(exc: Exception, path: Path) -> bool:
    text = str(exc).lower()
    return "full" in text or getattr(exc, "errno", None) == 28 or ("i/o error" in text and _nearly_full(path.parent))


def _why(exc: Exception, path: Path) -> str:
    text = str(exc).lower()
    if _is_full(exc, path):
        reason = "the disk is full"
    elif "readonly" in text or "read-only" in text or isinstance(exc, PermissionError) or "permission" in text:
        reason = "the data folder is read-only" if not os.access(path.parent, os.W_OK) else f"{path.name} is read-only"
    elif "unable to open" in text and not path.parent.exists():  # the whole data folder deleted while Parley ran
        reason = f"the folder {path.parent} was deleted"
    elif isinstance(exc, (FileExistsError, NotADirectoryError)):  # "[Errno 17] File exists" said nothing useful
        blocking = next((p for p in path.parents if p.is_file()), path.parent)
        reason = f"{blocking} is a file, not a folder"
    else:
        reason = str(exc)
    return f"Chats cannot be saved to {path} ({reason}); they are kept in memory until Parley quits."
