"""Export/import: JSON round-trips the whole tree exactly; Markdown keeps the branch shown; hostile files are refused."""
from __future__ import annotations

import json
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from app.core.chat_settings import ChatSettings
from app.core.export import (MAX_DEPTH, MAX_IMPORT_BYTES, ImportFormatError, chat_dict, export_json, export_markdown,
                        import_file, import_json, import_markdown, _depth)
from app.core.conversations import ConversationStore
from app.core.sqlite_store import SqliteConversationStore


def _branched(store):
    conv = store.create("Trip ideas", ChatSettings(system_prompt="Be brief.", temperature=0.2, seed=1))
    u1 = store.add_message(conv.id, None, "user", "Where to go?")
    a1 = store.add_message(conv.id, u1.id, "assistant", "Lisbon.")
    store.update_message(a1.id, stats={"reason": "stop", "tokens_per_s": 31.5}, model="tiny-qwen")
    a1b = store.add_message(conv.id, u1.id, "assistant", "Porto, partly", "interrupted")
    u2 = store.add_message(conv.id, a1.id, "user", "Why?\n```py\nprint('x')\n```")
    store.add_message(conv.id, u2.id, "assistant", "", "error")
    store.update_message(a1b.id, error="cut")
    u1b = store.add_message(conv.id, None, "user", "Edited first prompt \x00\x1b[31m")
    store.select(a1.id)
    store.update(conv.id, pinned=True)
    return conv, u1b


@pytest.mark.parametrize("target", ["memory", "sqlite"])
def test_json_round_trips_exactly(tmp_path, target):
    src = ConversationStore()
    conv, _ = _branched(src)
    second = src.create("Other")
    src.add_message(second.id, None, "user", "hello")
    text = export_json(src)
    dst = ConversationStore() if target == "memory" else SqliteConversationStore(tmp_path / "p.db")
    ids = import_json(dst, text)
    assert export_json(dst, ids) == text
    if target == "sqlite":  # and it survives a reopen
        dst.close()
        assert export_json(SqliteConversationStore(tmp_path / "p.db"), ids) == text
    single = export_json(src, [conv.id])
    assert json.loads(single)["conversations"] == [chat_dict(src, conv.id)]


@pytest.mark.parametrize("changed", [dict(thinking=True), dict(thinking=False), dict(seed=2**64 - 1, top_k=0),
                                     dict(speculative=False, overflow="stop", temperature=1)])
def test_a_chat_with_any_settings_a_user_can_choose_imports_back(changed):
    """A chat exported with Thinking on or off was refused on import ('setting 'thinking' has the wrong type'): the
    check took the type of each setting's default, and thinking's default is None."""
    src = ConversationStore()
    conv = src.create("Set", ChatSettings(**changed))
    src.add_message(conv.id, None, "user", "hello")
    text = export_json(src)
    dst = ConversationStore()
    assert dst.get(import_json(dst, text)[0]).settings == conv.settings and export_json(dst) == text


def test_markdown_export_and_import(tmp_path):
    src = ConversationStore()
    conv, _ = _branched(src)
    md = export_markdown(src)
    assert "# Trip ideas" in md and "(version 1 of 2)" in md and "Lisbon." in md and "Be brief." in md
    (tmp_path / "chats.md").write_text(md, encoding="utf-8")
    dst = ConversationStore()
    [cid] = import_file(dst, tmp_path / "chats.md")
    assert [(m.role, m.content) for m in dst.path(cid)] == [(m.role, m.content) for m in src.path(conv.id)]
    assert dst.get(cid).settings.system_prompt == "Be brief." and dst.path(cid)[1].model == "tiny-qwen"
    with pytest.raises(ImportFormatError, match="markers"):
        import_markdown(dst, "# A title\n\njust text")


@pytest.mark.parametrize("text, words", [
    ("", "not valid JSON"),
    ("{", "not valid JSON"),
    ("[]", "not a Parley chat export"),
    ('{"format": "parley-chats", "version": 99, "conversations": []}', "version"),
    ('{"format": "parley-chats", "version": 1, "conversations": [{"messages": [{"id": 0, "parent": 3, "role": "user"}]}]}', "earlier"),
    ('{"format": "parley-chats", "version": 1, "conversations": [{"messages": [{"id": 0, "role": "root"}]}]}', "role"),
    ('{"format": "parley-chats", "version": 1, "conversations": [{"settings": {"top_p": 0}, "messages": []}]}', "settings"),
    ('{"format": "parley-chats", "version": 1, "conversations": [{"messages": [], "leaf": 4}]}', "leaf"),
    ('{"format": "parley-chats", "version": 1, "conversations": [{"messages": [{"id": 0, "role": "user", "created_at": NaN}]}]}', "JSON"),
    ("[" * 100_000 + "]" * 100_000, "nests deeper"),
    ('{"a": "' + "[" * 5000 + '"}', "not a Parley"),  # brackets inside a string do not count
])
def test_malformed_imports_are_refused_cleanly(text, words):
    store = ConversationStore()
    with pytest.raises(ImportFormatError, match=words):
        import_json(store, text)
    assert store.conversations() == []  # nothing half-imported


def test_huge_file_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(MAX_IMPORT_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ImportFormatError, match="limited"):
        import_file(ConversationStore(), big)
    (tmp_path / "latin1.json").write_bytes(b'{"title": "caf\xe9"}')
    with pytest.raises(ImportFormatError, match="not UTF-8"):
        import_file(ConversationStore(), tmp_path / "latin1.json")


def test_depth_scan_follows_strings_and_escapes():
    assert _depth(b'{"a": [1, {"b": "]]]]\\"[[["}]}') == 3
    assert _depth(b'["\\\\", [[]]]') == 3  # an escaped backslash does not escape the quote
    chunked = b'[' + b'"' + b'\\' * 7 + b'"' + b'x' * 10 + b'"' + b'[' * 3 + b']' * 3 + b']'
    assert _depth(chunked) == _depth(chunked, chunk=4) == 4


def _depth_by_hand(raw: bytes) -> int:
    """_depth a byte at a time: a quote after an even run of backslashes is a string boundary."""
    depth = deepest = run = 0
    inside = False
    for byte in raw:
        if byte == 34 and run % 2 == 0:
            inside = not inside
        elif not inside and byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif not inside and byte in b"]}":
            depth -= 1
        run = run + 1 if byte == 92 else 0
    return deepest


def test_depth_scan_of_a_large_export_takes_a_fraction_of_a_second():
    """Every byte's running count took 272 ms for these 10.6 MB (0.8 s of reading a 25 MB file); 55-71 ms now."""
    answer = json.dumps('Here is the code:\n\n```python\ndef f(x):\n    return "value: " + str(x)\n```\n' * 100)
    raw = ("[" + ",".join([f'{{"role": "assistant", "content": {answer}}}'] * 1300) + "]").encode()
    best = min(_timed(_depth, raw) for _ in range(3))  # the best of three: a loaded machine slows one run, not all
    assert len(raw) > 10e6 and _depth(raw) == 2 and best < 0.2, f"{best * 1e3:.0f} ms"


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def test_depth_scan_counts_as_a_byte_at_a_time_does():
    """Only quotes, backslashes and brackets are looked at one by one now (1.1 s -> 0.2 s for a 25 MB export)."""
    rng = random.Random(5)
    tokens = [b'"', b"\\", b"\\\\", b'\\"', b"[", b"]", b"{", b"}", b"a", b'"x"']
    for _ in range(400):
        raw = b"".join(rng.choices(tokens, k=rng.randrange(0, 50)))
        assert _depth(raw) == _depth(raw, chunk=rng.randrange(1, 9)) == _depth_by_hand(raw), raw


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
message = st.fixed_dictionaries({"id": st.integers(0, 3), "role": st.sampled_from(["user", "assistant", "x"]),
                                 "content": st.text(max_size=30)},
                                optional={"parent": st.none() | st.integers(-1, 3), "stats": json_values,
                                          "state": st.sampled_from(["done", "streaming", "bad"]), "created_at": json_values})
chat = st.fixed_dictionaries({"messages": st.lists(message, max_size=4)},
                             optional={"title": json_values, "leaf": json_values, "settings": json_values})
export = st.fixed_dictionaries({"format": st.just("parley-chats"), "version": st.just(1),
                                "conversations": st.lists(chat, max_size=3)})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(export, json_values))
def test_fuzzed_imports_either_load_or_say_why(data):
    store = ConversationStore()
    try:
        ids = import_json(store, json.dumps(data))
    except ImportFormatError as exc:
        assert str(exc) and store.conversations() == []
        return
    assert export_json(store, ids)  # what was accepted is a well-formed tree


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_fuzzed_bytes_never_crash(raw):
    try:
        import_json(ConversationStore(), raw)
    except ImportFormatError:
        pass


def test_markdown_of_every_chat_imports_with_an_empty_one_among_them():
    """A new chat has no messages yet: its '# title' alone made the whole "Export all chats" file refuse to import."""
    src = ConversationStore()
    chat = src.create("Real chat")
    src.add_message(chat.id, None, "user", "hello")
    src.create("New chat")
    src.create("Rules only", ChatSettings(system_prompt="Be terse."))
    dst = ConversationStore()
    ids = import_markdown(dst, export_markdown(src))
    assert [dst.get(i).title for i in ids] == [c.title for c in src.conversations()]
    assert [[m.content for m in dst.path(i)] for i in ids] == [[m.content for m in src.path(c.id)] for c in src.conversations()]
    with pytest.raises(ImportFormatError, match="markers"):  # text without markers is still no Parley export
        import_markdown(ConversationStore(), "# Notes\n\njust text")


def test_markdown_saved_with_windows_line_ends_imports(tmp_path):
    """An export opened and saved in a Windows editor ends its lines in CRLF: no marker matched and it was refused."""
    src = ConversationStore()
    conv, _ = _branched(src)
    (tmp_path / "chats.md").write_bytes(export_markdown(src).replace("\n", "\r\n").encode())
    dst = ConversationStore()
    [cid] = import_file(dst, tmp_path / "chats.md")
    assert [(m.role, m.content) for m in dst.path(cid)] == [(m.role, m.content) for m in src.path(conv.id)]
    assert dst.get(cid).settings.system_prompt == "Be brief."


@pytest.mark.parametrize("content, thought, reply, thinking", [
    ("<think>\nWeigh it up.\n</think>\n\nLisbon.", "Weigh it up.", "Lisbon.", False),
    ("[THINK]Short.[/THINK]Porto.", "Short.", "Porto.", False),
    ("<think>\nCut short </details> here\n</details>\nstill", "Cut short </details> here\n</details>\nstill", "", True),
    ("<details><summary>Thought</summary>\n\nnot a thought\n</details>", None,
     "<details><summary>Thought</summary>\n\nnot a thought\n</details>", False),
])
def test_markdown_folds_a_thought_and_imports_it_back(content, thought, reply, thinking):
    from app.core.reasoning import split_reasoning

    src = ConversationStore()
    conv = src.create("Reasoning")
    u = src.add_message(conv.id, None, "user", "Where?")
    src.add_message(conv.id, u.id, "assistant", content)
    md = export_markdown(src)
    assert "<think>" not in md and "[THINK]" not in md
    if thought is not None:
        assert "<details><summary>Thought" in md and "\n\n</details>" in md
    dst = ConversationStore()
    [cid] = import_markdown(dst, md)
    back = split_reasoning(dst.path(cid)[1].content)
    assert (back.thought, back.reply, back.thinking) == (thought, reply, thinking)


def test_markdown_of_an_empty_thought_is_the_reply_alone():
    src = ConversationStore()
    conv = src.create("No thinking")
    u = src.add_message(conv.id, None, "user", "Hi")
    src.add_message(conv.id, u.id, "assistant", "<think>\n\n</think>\n\nHello.")
    assert "<details>" not in export_markdown(src) and "Hello." in export_markdown(src)


def test_markdown_exported_imported_into_a_fresh_home_and_exported_again_is_the_same(tmp_path):
    """Code, a table, a thought, CJK, emoji, structure-like lines, messages ending in line breaks, and answers stopped,
    interrupted or failed: the import read every answer as done, and the second export lost each ' — stopped'
    (' — interrupted', ' — failed'); a message's last line breaks, written as blank lines and read as none, came out
    fewer the second time."""
    src = ConversationStore()
    conv = src.create("Round trip 🎉 — 中文", ChatSettings(system_prompt="Be brief.\n日本語で"))
    turns = [("user", "Code?\n```python\ndef f(x):\n    return x * 2  \n```\n\n"),
             ("assistant", "<think>\nThey want code 🤔.\n</think>\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                           "```js\nlet s = '---'\n```\n"),
             ("user", "中文怎么样？ 👩‍👩‍👧\n---\n<!-- parley:user -->"),
             ("assistant", "答えは 42 です 🎉", "stopped"), ("user", "again"), ("assistant", "Half an ans", "interrupted"),
             ("user", "once more"), ("assistant", "", "error"), ("user", "think"),
             ("assistant", "<think>\nstill at </details> and", "stopped")]
    ids = [None]
    for role, text, *state in turns:
        ids.append(src.add_message(conv.id, ids[-1], role, text, *state).id)
    src.update_message(ids[2], model="tiny-qwen — stopped")  # done, in a name that ends as a heading's note does
    md = export_markdown(src)
    home = SqliteConversationStore(tmp_path / "parley.db")
    [cid] = import_markdown(home, md)
    assert export_markdown(home) == md
    assert [m.state for m in home.path(cid)][1::2] == ["done", "stopped", "interrupted", "error", "stopped"]
    home.close()


def test_markdown_of_several_chats_imports_in_the_order_it_lists_them(tmp_path):
    """Markdown keeps no times: each chat took the time it was added, and the list (newest first) read the file
    backwards, so an export of every chat imported into a fresh home and exported again came out reversed."""
    src = ConversationStore()
    for title in ("Oldest", "Middle", "Newest"):
        src.add_message(src.create(title).id, None, "user", f"about {title}")
    md = export_markdown(src)
    home = SqliteConversationStore(tmp_path / "parley.db")
    import_markdown(home, md)
    assert [c.title for c in home.conversations()] == ["Newest", "Middle", "Oldest"]
    assert export_markdown(home) == md
    home.close()
