"""The database file: connection settings, the versioned schema and its migrations, the search index.

`PRAGMA user_version` holds how many of MIGRATIONS have run; a new version appends a function, never edits one.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

BUSY_TIMEOUT_MS = 2000


def run_script(db: sqlite3.Connection, sql: str) -> None:
    """Runs each statement inside the caller's transaction (executescript would commit it first)."""
    statement = ""
    for piece in sql.split(";"):
        statement += piece + ";"
        if sqlite3.complete_statement(statement):
            if statement.strip(" \n;"):
                db.execute(statement)
            statement = ""


def _v1_core(db: sqlite3.Connection) -> None:
    run_script(db, """
        CREATE TABLE conversation (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            pinned INTEGER NOT NULL DEFAULT 0,
            hidden INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            leaf_id INTEGER,
            settings_json TEXT NOT NULL
        );
        CREATE TABLE message (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversation(id) ON DELETE CASCADE,
            parent_id INTEGER REFERENCES message(id) ON DELETE CASCADE,
            role TEXT NOT NULL,
            content TEXT NOT NULL DEFAULT '',
            state TEXT NOT NULL DEFAULT 'done',
            error TEXT NOT NULL DEFAULT '',
            stats_json TEXT,
            model TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL
        );
        CREATE INDEX message_tree ON message(conversation_id, parent_id, id);
    """)


def _v2_compare_and_models(db: sqlite3.Connection) -> None:
    run_script(db, """
        CREATE TABLE compare_group (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL
        );
        CREATE TABLE compare_member (
            group_id INTEGER NOT NULL REFERENCES compare_group(id) ON DELETE CASCADE,
            conversation_id INTEGER NOT NULL REFERENCES conversation(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            PRIMARY KEY (group_id, position)
        );
        CREATE TABLE model (
            key TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            path TEXT NOT NULL,
            kind TEXT NOT NULL,
            added_at REAL NOT NULL
        );
    """)


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1_core, _v2_compare_and_models]
VERSION = len(MIGRATIONS)


class SchemaTooNewError(sqlite3.DatabaseError):
    """The file was written by a newer Parley: opening it read-write could damage it."""


def connect(path: Path, read_only: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL journal, foreign keys on.

    Read-only falls back to `immutable=1`: a WAL file in a read-only folder cannot be opened otherwise.
    """
    if read_only:
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
            db.execute("PRAGMA user_version").fetchone()
        except sqlite3.OperationalError:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True, isolation_level=None)
    else:
        db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    db.execute("PRAGMA foreign_keys = ON")
    if not read_only:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a commit survives a process crash
    return db


def migrate(db: sqlite3.Connection) -> int:
    """Runs the migrations this file has not seen yet, each in its own transaction; returns the version."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > VERSION:
        raise SchemaTooNewError(f"the chat database has schema version {version}; this Parley knows up to {VERSION}")
    for number in range(version + 1, VERSION + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[number - 1](db)
            db.execute(f"PRAGMA user_version = {number}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    ensure_indexes(db)
    return VERSION


def ensure_indexes(db: sqlite3.Connection) -> None:
    """Indexes that change no meaning, outside the versions (an older Parley opens the file as before): deleting a
    message looks up its replies through the parent_id cascade, a scan of every message without this one (a
    500-message chat took 7-14 s to delete, the window frozen)."""
    db.execute("CREATE INDEX IF NOT EXISTS message_parent ON message(parent_id)")


UNFINISHED = "('waiting', 'queued', 'streaming')"  # an answer still being written: indexed once it ends
# The search index holds finished messages only: re-indexed at each flush, a streaming answer's whole text went out of
# the trigram index and back in every 0.5 s (a 190 kB answer: 21 ms of the GUI thread a flush, 0.5 ms without).
# The store's UPDATE of a message always sets its content: a change of state, stats or time alone does not re-index.
FTS_TRIGGERS = f"""
    CREATE TRIGGER message_fts_insert AFTER INSERT ON message WHEN new.state NOT IN {UNFINISHED} BEGIN
        INSERT INTO message_fts(rowid, content) VALUES (new.id, new.content);
    END;
    CREATE TRIGGER message_fts_delete AFTER DELETE ON message WHEN old.state NOT IN {UNFINISHED} BEGIN
        INSERT INTO message_fts(message_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END;
    CREATE TRIGGER message_fts_update AFTER UPDATE OF content, state ON message
    WHEN old.content IS NOT new.content OR old.state IS NOT new.state BEGIN
        INSERT INTO message_fts(message_fts, rowid, content) SELECT 'delete', old.id, old.content
            WHERE old.state NOT IN {UNFINISHED};
        INSERT INTO message_fts(rowid, content) SELECT new.id, new.content WHERE new.state NOT IN {UNFINISHED};
    END;
"""
# what triggers that indexed every message had put in for the unfinished ones (exactly their text: kept in step)
UNINDEX_UNFINISHED = f"""
    INSERT INTO message_fts(message_fts, rowid, content) SELECT 'delete', id, content FROM message
        WHERE state IN {UNFINISHED};
"""
TRIGGERS = ("message_fts_insert", "message_fts_delete", "message_fts_update")


def ensure_search_index(db: sqlite3.Connection) -> bool:
    """A trigram FTS5 index over finished messages' text (substring search, like the in-memory store; the store looks
    in unfinished ones itself); False without FTS5.

    Kept outside the versioned migrations: a build without FTS5 gets none, and a later build with it adds it.
    """
    exists = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'message_fts'").fetchone()
    if exists:
        _index_finished_only(db)
        return True
    try:
        db.execute("BEGIN IMMEDIATE")
        run_script(db, """
            CREATE VIRTUAL TABLE message_fts USING fts5(
                content, content='message', content_rowid='id', tokenize='trigram');
            INSERT INTO message_fts(message_fts) VALUES ('rebuild');
        """ + UNINDEX_UNFINISHED + FTS_TRIGGERS)
        db.execute("COMMIT")
        return True
    except sqlite3.OperationalError as exc:
        if db.in_transaction:
            db.execute("ROLLBACK")
        if "fts5" in str(exc).lower() or "tokenizer" in str(exc).lower():
            return False
        raise


def _index_finished_only(db: sqlite3.Connection) -> None:
    """A file whose triggers indexed every message gets FTS_TRIGGERS (an older Parley keeps them: they live in the
    file), its unfinished messages taken out of the index in the same transaction."""
    sql = db.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'message_fts_insert'").fetchone()
    if sql is None or " WHEN " in sql[0].upper():
        return
    try:
        db.execute("BEGIN IMMEDIATE")
        for name in TRIGGERS:
            db.execute(f"DROP TRIGGER IF EXISTS {name}")
        run_script(db, UNINDEX_UNFINISHED + FTS_TRIGGERS)
        db.execute("COMMIT")
    except sqlite3.OperationalError:  # locked by another program, say: the old triggers work, only slower; next start
        if db.in_transaction:
            db.execute("ROLLBACK")
