"""The chat store against a second app instance and a damaged file (issue 23, items 6 and 7)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from app.core.sqlite_store import SqliteConversationStore

HOLDER = textwrap.dedent("""
    import sys
    from app.core.sqlite_store import SqliteConversationStore
    store = SqliteConversationStore(sys.argv[1])
    conv = store.create("held")
    store.add_message(conv.id, None, "user", "from the first instance")
    print("ready", store.persistent, flush=True)
    sys.stdin.readline()
    store.add_message(conv.id, None, "user", "written after the second one tried")
    saved = store.persistent
    store.close()
    print("closed", saved, flush=True)
""")


def test_a_second_instance_on_one_data_dir_is_refused(tmp_path):
    path = tmp_path / "data" / "parley.db"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert first.stdout.readline().split() == ["ready", "True"]
        second = SqliteConversationStore(path)
        assert second.locked_out and not second.persistent
        assert "already open" in second.warning and str(path.parent) in second.warning
        assert [c.title for c in second.conversations()] == ["held"]  # shown, read-only
        mine = second.create("would reuse the first one's ids")
        second.add_message(mine.id, None, "user", "kept in memory only")
        second.close()
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.stdout.readline().split() == ["closed", "True"]
    finally:
        first.stdin.close()
        first.wait(30)
    assert first.returncode == 0
    again = SqliteConversationStore(path)  # the first has gone: the folder is free again
    assert again.persistent and not again.locked_out and not again.warning
    titles = [c.title for c in again.conversations()]
    assert titles == ["held"]
    conv = again.conversations()[0]
    assert [m.content for m in again.children(conv.id, None)] == ["from the first instance",
                                                                 "written after the second one tried"]
    again.close()


def _filled(path, chats: int = 30) -> list[int]:
    store = SqliteConversationStore(path)
    ids = []
    for i in range(chats):
        conv = store.create(f"chat {i}")
        store.add_message(conv.id, None, "user", f"message {i} " + "x" * 2000)
        ids.append(conv.id)
    store.close()
    return ids


def test_damage_on_the_last_page_is_found_at_open_and_set_aside(tmp_path):
    path = tmp_path / "parley.db"
    _filled(path)
    data = bytearray(path.read_bytes())
    page = 4096
    data[-page:] = bytes((i * 7 + 13) % 256 for i in range(page))
    path.write_bytes(bytes(data))
    store = SqliteConversationStore(path)
    assert "damaged" in store.warning, store.warning
    assert list(tmp_path.glob("parley.db.damaged-*"))
    assert store.persistent
    for conv in store.conversations():  # touching any chat on screen keeps the store on disk
        store.add_message(conv.id, conv.leaf_id, "user", "still saved")
        assert store.persistent, store.warning
    shown = {c.id: c.title for c in store.conversations()}
    store.close()
    reopened = SqliteConversationStore(path)
    assert {c.id: c.title for c in reopened.conversations()} == shown
    assert not reopened.warning
    reopened.close()


def test_chats_read_before_the_damage_are_kept_in_the_new_file(tmp_path):
    path = tmp_path / "parley.db"
    ids = _filled(path, chats=60)
    data = bytearray(path.read_bytes())
    mid = len(data) // 2 // 4096 * 4096
    data[mid:mid + 4096] = b"\xff" * 4096
    path.write_bytes(bytes(data))
    store = SqliteConversationStore(path)
    assert "damaged" in store.warning and store.persistent
    kept = [c.id for c in store.conversations()]
    assert set(kept) <= set(ids)
    for cid in kept:
        assert store.path(cid) == [] or store.path(cid)[0].conversation_id == cid
        store.add_message(cid, None, "user", "touch")
        assert store.persistent, store.warning
    store.close()
    reopened = SqliteConversationStore(path)
    assert sorted(c.id for c in reopened.conversations()) == sorted(kept) and not reopened.warning
    reopened.close()
