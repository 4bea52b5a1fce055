"""Export and import chats: JSON (the whole message tree, round-trips exactly) and Markdown (the branch shown).

Imports are untrusted: size and nesting are capped before parsing, every field is checked after, and
nothing is written to the store until the whole file has passed.
"""
from __future__ import annotations

import codecs
import itertools
import json
import math
import os
import re
import stat
import time
import typing
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from app.core.chat_settings import ChatSettings
from app.core.conversations import ConversationStore
from app.core.json_stream import JsonPieces
from app.core.reasoning import CLOSE, OPEN, split_reasoning
from engine.errors import ParleyError

FORMAT = "parley-chats"
VERSION = 1
MAX_IMPORT_BYTES = 32 << 20
MAX_DEPTH = 16  # the format itself needs 5
MAX_MESSAGES = 200_000  # in one file
MAX_TEXT = 4 << 20  # characters in one message or title
PIECES = {"conversations": [{"messages": [None]}]}  # an export parsed a message at a time (JsonPieces)
ROLES = ("user", "assistant", "system")
STATES = ("done", "stopped", "error", "interrupted")
UNFINISHED = ("waiting", "queued", "streaming")  # saved mid-answer: comes back interrupted
MD_BREAK = re.compile(r"\n\n---\n\n(?=# )")  # between two chats
MD_BREAK_LEN = len("\n\n---\n\n# ")
MD_TEXT = re.compile(r"\S")
MD_MARK = re.compile(r"^<!-- parley:(user|assistant|system)(?: model=(.*?))? -->$", re.M)
# Lines of a message that would read as Parley's own structure (a marker, the chat separator) get one more
# leading backslash on export and lose one on import: text never becomes a system prompt or a new chat.
MD_STRUCTURE = re.compile(r"^(\\*)(<!-- parley:|---$)", re.M)
MD_ESCAPED = re.compile(r"^\\(\\*)(<!-- parley:|---$)", re.M)
# A thought folds away as it does in the app (GitHub, editors' previews); its own lines that would end the fold, and a
# reply that starts as one would, get a backslash as the markers do.
THOUGHT_FOLD = ("<details><summary>Thought</summary>", "<details><summary>Thought (unfinished)</summary>")
FOLD_END = "</details>"
FOLD_LINE = re.compile(r"^(\\*)(</details>|<details><summary>Thought)", re.M)
FOLD_LINE_ESCAPED = re.compile(r"^\\(\\*)(</details>|<details><summary>Thought)", re.M)
# A message's heading ends in how it ended, where not done (after its version, which an import has no use for).
MD_CUTS = {"interrupted": " — interrupted", "stopped": " — stopped", "error": " — failed"}
MD_VERSION = re.compile(r"\A \(version \d+ of \d+\)")
MD_ORDER_S = 1e-3  # a Markdown chat's time before the one above it (the file keeps none): the list keeps its order


class ImportFormatError(ParleyError):
    """A file that is not a Parley export, or one that breaks its limits."""


# -- export: chats_of reads the store (the GUI thread's part); render_* make the text anywhere from what it read
def chats_of(store: ConversationStore, conv_ids: list[int] | None = None) -> list[dict]:
    """One chat, several, or every chat in the sidebar (None), as plain data that later changes to the store leave
    alone (its texts are immutable strings; stats and settings are copies)."""
    ids = conv_ids if conv_ids is not None else [c.id for c in store.conversations()]
    return [chat_dict(store, i) for i in ids]


def chat_dict(store: ConversationStore, conv_id: int) -> dict:
    conv = store.get(conv_id)
    msgs = _tree(store, conv_id)
    local = {m.id: i for i, m in enumerate(msgs)}
    return {
        "title": conv.title, "pinned": conv.pinned, "hidden": conv.hidden,
        "created_at": conv.created_at, "updated_at": conv.updated_at,
        "settings": conv.settings.to_dict(), "leaf": local.get(conv.leaf_id),
        "messages": [{"id": local[m.id], "parent": local.get(m.parent_id), "role": m.role, "content": m.content,
                      "state": m.state, "error": m.error, "stats": dict(m.stats) if m.stats is not None else None,
                      "model": m.model, "created_at": m.created_at} for m in msgs],
    }


def render_json(chats: list[dict]) -> str:
    return "".join(json_pieces(chats))


def render_markdown(chats: list[dict]) -> str:
    return "".join(markdown_pieces(chats))


def json_pieces(chats: list[dict]) -> typing.Iterator[str]:
    """render_json's text a chat at a time (one string of 25 MB made and encoded at once held the GIL 60-110 ms):
    json.dumps of the whole, each chat indented as its place in it."""
    if not chats:
        yield json.dumps({"format": FORMAT, "version": VERSION, "conversations": []}, ensure_ascii=False, indent=1)
        return
    yield f'{{\n "format": {json.dumps(FORMAT)},\n "version": {VERSION},\n "conversations": [\n  '
    for i, chat in enumerate(chats):  # indent's line breaks are the only raw ones: a string's are escaped
        yield (",\n  " if i else "") + json.dumps(chat, ensure_ascii=False, indent=1).replace("\n", "\n  ")
    yield "\n ]\n}"


def markdown_pieces(chats: list[dict]) -> typing.Iterator[str]:
    for i, chat in enumerate(chats):
        yield ("\n\n---\n\n" if i else "") + _chat_markdown(chat)
    yield "\n"


def export_json(store: ConversationStore, conv_ids: list[int] | None = None) -> str:
    """One chat, several, or every chat in the sidebar (None)."""
    return render_json(chats_of(store, conv_ids))


def export_markdown(store: ConversationStore, conv_ids: list[int] | None = None) -> str:
    return render_markdown(chats_of(store, conv_ids))


def _chat_markdown(chat: dict) -> str:
    """The branch shown (leaf up to its root), each message with its place among its versions."""
    msgs = chat["messages"]
    versions: dict[tuple, list[int]] = {}  # (parent, role) -> ids, oldest first, as the store's siblings
    for m in msgs:
        versions.setdefault((m["parent"], m["role"]), []).append(m["id"])
    parts = [f"# {_one_line(chat['title'])}"]
    if chat["settings"].get("system_prompt"):
        parts.append(f"<!-- parley:system -->\n> **System:** {_md_escape(chat['settings']['system_prompt'])}")
    for m in _branch(msgs, chat["leaf"]):
        same = versions[(m["parent"], m["role"])]
        note = f" (version {same.index(m['id']) + 1} of {len(same)})" if len(same) > 1 else ""
        model = f" model={_one_line(m['model'])}" if m["model"] else ""
        cut = MD_CUTS.get(m["state"], "")
        body = _answer_markdown(m["content"]) if m["role"] == "assistant" else _md_escape(m["content"])
        body = body.rstrip("\n")  # an import reads none: written as blank lines, they came out fewer the second time
        parts.append(f"<!-- parley:{m['role']}{model} -->\n{_heading(m['role'], m['model'])}{note}{cut}\n\n{body}")
    return "\n\n".join(parts)


def _heading(role: str, model: str) -> str:
    return f"### {_one_line('You' if role == 'user' else model or 'Assistant')}"


def _branch(msgs: list[dict], leaf: int | None) -> list[dict]:
    out = []
    while leaf is not None:
        out.append(msgs[leaf])
        leaf = msgs[leaf]["parent"]
    return out[::-1]


def _answer_markdown(content: str) -> str:
    """An answer's thought as a fold above its reply (raw `<think>` tags showed as text, or as nothing at all where
    a viewer drops unknown HTML)."""
    r = split_reasoning(content)
    if r.thought is None:
        return _fold_escape(_md_escape(content))
    if not r.thought and not r.thinking:  # thinking switched off: the template's empty thought says nothing
        return _fold_escape(_md_escape(r.reply))
    fold = f"{THOUGHT_FOLD[r.thinking]}\n\n{_fold_escape(_md_escape(r.thought))}\n\n{FOLD_END}"
    return f"{fold}\n\n{_fold_escape(_md_escape(r.reply))}" if r.reply else fold


def _answer_from_markdown(text: str) -> str:
    """The stored answer of an exported one: a fold becomes the thought again, in `<think>` tags (the form every
    reasoning split reads)."""
    fold = next((f for f in THOUGHT_FOLD if text.startswith(f + "\n")), None)
    if fold is None:
        return _fold_unescape(_md_unescape(text))
    thought, _, reply = text[len(fold):].partition(f"\n{FOLD_END}")
    thought, reply = (_fold_unescape(_md_unescape(part.strip("\n"))) for part in (thought, reply))
    if fold == THOUGHT_FOLD[1]:  # cut short while thinking: the thought stays open
        return f"{OPEN}\n{thought}"
    return f"{OPEN}\n{thought}\n{CLOSE}\n\n{reply}"


def _fold_escape(text: str) -> str:
    return FOLD_LINE.sub(lambda m: "\\" + m.group(1) + m.group(2), text)


def _fold_unescape(text: str) -> str:
    return FOLD_LINE_ESCAPED.sub(lambda m: m.group(1) + m.group(2), text)


def _tree(store: ConversationStore, conv_id: int) -> list:
    """Every message of the chat, parents before children (ids grow)."""
    out, todo = [], [None]
    while todo:
        kids = store.children(conv_id, todo.pop())
        out += kids
        todo += [k.id for k in kids]
    return sorted(out, key=lambda m: m.id)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _md_title(title: str) -> str:
    """A title as a Markdown export reads back: one line of at most 200 characters."""
    return _one_line(title)[:200].rstrip() or "Imported chat"


def _md_escape(text: str) -> str:
    return MD_STRUCTURE.sub(lambda m: "\\" + m.group(1) + m.group(2), text)


def _md_unescape(text: str) -> str:
    return MD_ESCAPED.sub(lambda m: m.group(1) + m.group(2), text)


# -- import
def read_import(path: str | Path) -> str:
    """The file's text: a regular file (not a FIFO that blocks or a device that never ends, even behind a
    symlink) of at most MAX_IMPORT_BYTES, which is all that is ever read."""
    path = Path(path)
    return _decode(_read_bytes(path), path.name)


def _read_bytes(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
    except OSError as exc:
        raise ImportFormatError(f"{path.name} cannot be read: {exc.strerror}.") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ImportFormatError(f"{path.name} is not a regular file.")
        if info.st_size > MAX_IMPORT_BYTES:
            raise ImportFormatError(f"{path.name} is {info.st_size / 2**20:.0f} MiB; imports are limited to "
                                    f"{MAX_IMPORT_BYTES >> 20} MiB.")
        data = f.read(MAX_IMPORT_BYTES + 1)  # a file that grew since: still never more than the limit
    if len(data) > MAX_IMPORT_BYTES:
        raise ImportFormatError(f"{path.name} is larger than {MAX_IMPORT_BYTES >> 20} MiB.")
    return data


def _decode(data: bytes, name: str) -> str:
    return "".join(_text_pieces(data, name))


def _text_pieces(data: bytes, name: str, piece: int = 1 << 20) -> typing.Iterator[str]:
    """UTF-8 (a byte order mark dropped) a MiB at a time: one call over 25 MB held the GIL 43 ms."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    for start in range(0, max(len(data), 1), piece):
        try:
            yield decoder.decode(data[start:start + piece], final=start + piece >= len(data))
        except UnicodeDecodeError:
            break
    else:
        return
    try:
        data.decode("utf-8-sig")  # only to say where it fails, counted from the file's start
    except UnicodeDecodeError as exc:
        raise ImportFormatError(f"{name} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None


def import_file(store: ConversationStore, path: str | Path) -> list[int]:
    return add_chats(store, read_chats(path))


def read_chats(path: str | Path) -> list[dict]:
    """A file's chats, read and checked without the store (so on any thread); add_chats writes them."""
    path = Path(path)
    raw = _read_bytes(path)
    if path.suffix.lower() in (".md", ".markdown"):
        return markdown_chats(_text_pieces(raw, path.name))
    return json_chats(raw, name=path.name)


def add_chats(store: ConversationStore, chats: list[dict], present: Present | None = None) -> list[int]:
    """Checked chats (read_chats, json_chats, markdown_chats) as new chats in one batch; the ids of those added. A chat
    the store holds already (`present`: the store's chats when the import began) is skipped: an import that a crash cut
    short, run again, or a file imported twice, adds each chat once."""
    present = present if present is not None else Present(store)
    with getattr(store, "batch", nullcontext)():
        return [_add_chat(store, c) for c in chats if present.take(c) is None]


class Present:
    """The chats a store held when an import began, found by what they hold: a chat of the file is one of them where
    its title, its messages (their tree, roles and texts, trailing space aside: Markdown drops the last one's) and,
    where the file keeps it, the time it was started are the same. A chat read from Markdown holds the one branch its
    export showed, as Markdown gives it back: it is one of theirs where that is a branch of their tree (their edits and
    regenerations made it a copy at each import of their own export). Each chat of the store stands for one chat of the
    file (a file of three empty 'New chat's adds three)."""

    def __init__(self, store: ConversationStore):
        self.store = store
        self._titled: dict[str, list[int]] = {}  # title as Markdown keeps it -> chats not yet looked at
        for conv in store.conversations(include_hidden=True):
            self._titled.setdefault(_md_title(conv.title), []).append(conv.id)
        # (title, a first prompt) -> chats: a chat read whole (~35 us) only where these match, not each of the title's
        self._opening: dict[tuple, list[int]] = {}
        self._keys: dict[tuple[int, bool], typing.Any] = {}  # (chat, branch only) -> chat_key or branch_keys
        self._taken: set[int] = set()  # a chat of several first prompts is listed under each

    def take(self, chat: dict) -> int | None:
        """The id of the store's chat that `chat` is (no longer offered for another), or None."""
        title, branch = _md_title(chat["title"]), bool(chat.get("branch"))
        for conv_id in self._titled.pop(title, ()):
            if self.store.has(conv_id):
                for root in {_kept(m.role, m.content) for m in self.store.children(conv_id, None)} or {None}:
                    self._opening.setdefault((title, root), []).append(conv_id)
        first = next((_kept(m["role"], m["content"]) for m in chat["messages"] if m["parent"] is None), None)
        same = self._opening.get((title, first), [])
        for key in _wanted(chat, branch):  # the cheaper first: the next made only where it finds none
            for i, conv_id in enumerate(same):
                if conv_id in self._taken or not self.store.has(conv_id) \
                        or chat["created_at"] not in (None, self.store.get(conv_id).created_at):
                    continue  # taken, deleted since, or started at another time
                have = self._keys_of(conv_id, branch)
                if key in have if branch else key == have:
                    self._taken.add(conv_id)
                    return same.pop(i)
        return None

    def _keys_of(self, conv_id: int, branch: bool):
        if (conv_id, branch) not in self._keys:
            chat = chat_dict(self.store, conv_id)
            self._keys[conv_id, branch] = branch_keys(chat) if branch else chat_key(chat)
        return self._keys[conv_id, branch]


def chat_key(chat: dict) -> tuple:
    """A chat's title and messages (parent, role, text), as exported and as checked at import."""
    return chat["title"], tuple((m["parent"], m["role"], m["content"].rstrip()) for m in chat["messages"])


def branch_keys(chat: dict) -> set[tuple]:
    """The branches a Markdown export of the chat may have shown, as their messages (role, text) read back: each that
    ends where the tree does, and the one shown."""
    msgs = chat["messages"]
    inner = {m["parent"] for m in msgs}
    kept = [_kept(m["role"], m["content"]) for m in msgs]  # once, not once a branch
    return {_branch_key(msgs, end, kept) for end in {i for i in range(len(msgs)) if i not in inner} | {chat["leaf"]}}


def _wanted(chat: dict, branch: bool) -> typing.Iterator[tuple]:
    """What a chat of the file is looked for by: a JSON chat's chat_key; a Markdown chat's branch as its file says it
    (a Parley export's own), then as a Parley export of that text would read back (an older one's raw thought tags)."""
    if not branch:
        yield chat_key(chat)
        return
    msgs = chat["messages"]
    yield _branch_key(msgs, chat["leaf"], [m["content"].rstrip() for m in msgs])
    yield _branch_key(msgs, chat["leaf"], [_kept(m["role"], m["content"]) for m in msgs])


def _branch_key(msgs: list[dict], leaf: int | None, texts: list[str]) -> tuple:
    out = []
    while leaf is not None:
        out.append((msgs[leaf]["role"], texts[leaf]))
        leaf = msgs[leaf]["parent"]
    return tuple(out[::-1])


def _kept(role: str, content: str) -> str:
    """A message's text as its Markdown export reads back: an answer's thought in the form the export writes (an older
    export's raw tags read back as they are, and come to the same), trailing space dropped."""
    text = _answer_from_markdown(_answer_markdown(content)) if role == "assistant" else content
    return text.rstrip()


def import_json(store: ConversationStore, text: str | bytes) -> list[int]:
    """Adds every chat in a JSON export as new chats; returns their ids. ImportFormatError says what is wrong."""
    return add_chats(store, json_chats(text))


def json_chats(text: str | bytes, name: str = "The file") -> list[dict]:
    """A JSON export's chats, checked; bytes (a file's, named `name`) are read as UTF-8 a piece at a time."""
    data = _parse(text, name)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ImportFormatError("This is not a Parley chat export (no \"format\": \"parley-chats\").")
    if not isinstance(data.get("version"), int) or data["version"] > VERSION:
        raise ImportFormatError(f"This export has format version {data.get('version')!r}; this Parley reads up to {VERSION}.")
    convs = data.get("conversations")
    if not isinstance(convs, list):
        raise ImportFormatError("\"conversations\" must be a list.")
    chats = [_check_chat(c, i) for i, c in enumerate(convs)]
    if sum(len(c["messages"]) for c in chats) > MAX_MESSAGES:
        raise ImportFormatError(f"The file holds more than {MAX_MESSAGES:,} messages.")
    return chats


def import_markdown(store: ConversationStore, text: str) -> list[int]:
    """Chats exported as Markdown come back as one branch each (Markdown keeps no versions). Like JSON, the whole
    text is checked before anything is written, and it is written in one batch."""
    return add_chats(store, markdown_chats(text))


def markdown_chats(text: str | typing.Iterable[str]) -> list[dict]:
    """A Markdown export's chats, checked; its text whole or in pieces (a file's: read a chat at a time, as whole)."""
    pieces = [text] if isinstance(text, str) else text
    chats = [_markdown_chat(block) for block in _markdown_blocks(_unix_lines(_capped(pieces)))]
    if sum(len(c["messages"]) for c in chats) > MAX_MESSAGES:
        raise ImportFormatError(f"The file holds more than {MAX_MESSAGES:,} messages.")
    now = time.time()  # stamped as added, the file's last chat came first in the list: an export read back reversed
    for i, chat in enumerate(chats):
        chat["updated_at"] = now - i * MD_ORDER_S
    return chats


def _capped(pieces: typing.Iterable[str]) -> typing.Iterator[str]:
    size = 0
    for piece in pieces:
        size += len(piece)
        if size > MAX_IMPORT_BYTES:
            raise ImportFormatError("The text is too large to import.")
        yield piece


def _unix_lines(pieces: typing.Iterable[str]) -> typing.Iterator[str]:
    """The text with each CR LF made LF where its first line ends in one (saved again with Windows line ends: its
    markers would not match), as one str.replace over the whole text makes it."""
    pieces, first = iter(pieces), ""
    for piece in pieces:  # the first line decides
        first += piece
        if "\n" in first:
            break
    if not first.partition("\n")[0].endswith("\r"):
        yield first
        yield from pieces
        return
    held = ""  # a piece's last CR waits for the next piece's LF
    for piece in itertools.chain([first], pieces):
        piece = held + piece
        held = "\r" if piece.endswith("\r") else ""
        yield piece[:len(piece) - len(held)].replace("\r\n", "\n")
    yield held


def _markdown_blocks(pieces: typing.Iterable[str]) -> typing.Iterator[str]:
    """re.split(MD_BREAK, text.strip()) of the text the pieces make, each chat's block as soon as the next one begins:
    one split of a 25 MB text held the GIL 41 ms."""
    block: list[str] = []  # the current chat's text so far
    tail, lead = "", True  # tail: text a break may begin in, held for the next piece
    for piece in pieces:
        if lead:
            piece = piece.lstrip()
            lead = not piece
        text, start = tail + piece, 0
        cut = max(0, len(text) - MD_BREAK_LEN)  # a break beginning here may need the next piece to be seen
        for found in MD_BREAK.finditer(text):
            if found.start() >= cut or not MD_TEXT.search(text, found.end() + 2):  # only space after: stripped
                cut = min(cut, found.start())
                break
            block.append(text[start:found.start()])
            yield "".join(block)
            block, start = [], found.end()
        cut = max(cut, start)
        block.append(text[start:cut])
        tail = text[cut:]
    *whole, last = MD_BREAK.split(tail.rstrip())
    for part in whole:
        block.append(part)
        yield "".join(block)
        block = []
    yield ("".join(block) + last).rstrip()


def _markdown_chat(block: str) -> dict:
    """One '# title' block as the checked chat dict _add_chat takes."""
    title_line, _, body = block.partition("\n")
    if not title_line.startswith("# "):
        raise ImportFormatError("A chat in Markdown starts with a '# title' line.")
    title = _md_title(title_line[2:])
    marks = list(MD_MARK.finditer(body))
    if not marks and body.strip():  # a title alone is a chat without messages, as exported
        raise ImportFormatError(f"{title_line[2:80]!r} has no Parley message markers (<!-- parley:user -->).")
    if len(marks) > MAX_MESSAGES:
        raise ImportFormatError(f"{title[:80]!r} holds more than {MAX_MESSAGES:,} messages.")
    settings, messages = ChatSettings(), []
    for mark, nxt in zip(marks, marks[1:] + [None]):
        chunk = body[mark.end(): nxt.start() if nxt else len(body)].strip("\n")
        if mark.group(1) == "system":
            prompt = _md_unescape(chunk.removeprefix("> **System:** "))
            settings = settings.copy(system_prompt=_text(prompt, f"{title[:80]!r}: system prompt"))
            continue
        heading, _, text = chunk.partition("\n\n")
        text = text.rstrip("\n")
        content = _answer_from_markdown(text) if mark.group(1) == "assistant" else _md_unescape(text)
        where = f"{title[:80]!r}, message {len(messages) + 1}"
        model = _text(mark.group(2) or "", where)
        messages.append({"parent": len(messages) - 1 if messages else None, "role": mark.group(1),
                         "content": _text(content, where), "state": _md_state(heading, mark.group(1), model),
                         "error": "", "stats": None, "model": model, "created_at": None})
    return {"title": title, "settings": settings, "pinned": False, "hidden": False, "created_at": None,
            "updated_at": None, "leaf": len(messages) - 1 if messages else None, "messages": messages,
            "branch": True}  # the branch shown only: Present finds it among a chat's branches


def _md_state(heading: str, role: str, model: str) -> str:
    """How a message ended, from its heading as the export writes it (a model's name may itself end in ' — stopped')."""
    who = _heading(role, model)
    if not heading.startswith(who):
        return "done"  # written by hand, or by another program
    cut = MD_VERSION.sub("", heading[len(who):], count=1)
    return next((state for state, said in MD_CUTS.items() if cut == said), "done")


def _parse(text: str | bytes, name: str):
    raw = text.encode("utf-8", "replace") if isinstance(text, str) else text  # lone surrogates become '?'
    if len(raw) > MAX_IMPORT_BYTES:
        raise ImportFormatError(f"The file is larger than {MAX_IMPORT_BYTES >> 20} MiB.")
    if _depth(raw) > MAX_DEPTH:
        raise ImportFormatError(f"The JSON nests deeper than {MAX_DEPTH} levels; a Parley export never does.")
    pieces = _text_pieces(raw, name)
    try:
        return JsonPieces(pieces, parse_constant=_no_constant).document(PIECES)  # a message at a time
    except (ValueError, RecursionError) as exc:
        raise ImportFormatError(f"The file is not valid JSON: {exc}") from None


def _depth(raw: bytes, chunk: int = 1 << 20) -> int:
    """Deepest bracket nesting outside strings, without parsing: numpy over 1 MiB chunks, linear time, the quotes,
    backslashes and brackets taken out first (every byte's running count: 0.8 s for a 25 MB file, 0.2 s now).

    A quote is a string boundary unless an odd run of backslashes precedes it.
    """
    depth = deepest = bs_run = 0  # bs_run: backslashes at the end of the chunks before
    in_str = 0
    for start in range(0, len(raw), chunk):
        a = np.frombuffer(raw, np.uint8, count=min(chunk, len(raw) - start), offset=start)
        kind = _BYTE_KIND[a]
        quotes, slashes, brackets = (np.flatnonzero(kind == k) for k in (1, 2, 3))
        run, run_start = _runs_before(quotes, slashes, bs_run)
        bounds = quotes[run % 2 == 0]
        inside = (np.searchsorted(bounds, brackets) + in_str) % 2
        opens = (a[brackets] == 91) | (a[brackets] == 123)
        levels = depth + np.cumsum(np.where(inside == 0, np.where(opens, 1, -1), 0))
        if len(levels):
            deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
        in_str = (in_str + len(bounds)) % 2
        ends_in_run = len(slashes) and slashes[-1] == len(a) - 1
        bs_run = len(a) - int(run_start[-1]) + (bs_run if run_start[-1] == 0 else 0) if ends_in_run else 0
    return deepest


def _runs_before(quotes: np.ndarray, slashes: np.ndarray, carried: int) -> tuple[np.ndarray, np.ndarray]:
    """The backslashes right before each quote (a run at the chunk's start goes on with the `carried` before it), and
    where each backslash's run begins."""
    if not len(slashes):
        return np.where(quotes == 0, carried, 0), slashes
    first = np.flatnonzero(np.diff(slashes, prepend=-2) != 1)  # each run's first backslash
    run_start = np.repeat(slashes[first], np.diff(np.append(first, len(slashes))))
    last = np.maximum(np.searchsorted(slashes, quotes) - 1, 0)  # the last backslash before each quote
    ends = slashes[last] == quotes - 1
    length = slashes[last] - run_start[last] + 1 + np.where(run_start[last] == 0, carried, 0)
    return np.where(ends, length, np.where(quotes == 0, carried, 0)), run_start


_BYTE_KIND = np.zeros(256, np.uint8)  # _depth's bytes: 1 a quote, 2 a backslash, 3 a bracket
_BYTE_KIND[34], _BYTE_KIND[92], _BYTE_KIND[[91, 93, 123, 125]] = 1, 2, 3


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number")


def _check_chat(c, i: int) -> dict:
    where = f"Chat {i + 1}"
    if not isinstance(c, dict):
        raise ImportFormatError(f"{where} is not an object.")
    title = _text(c.get("title", "Imported chat"), f"{where}: title")
    settings = _check_settings(c.get("settings") or {}, where)
    msgs = c.get("messages")
    if not isinstance(msgs, list) or len(msgs) > MAX_MESSAGES:
        raise ImportFormatError(f"{where}: \"messages\" must be a list of at most {MAX_MESSAGES:,}.")
    checked = [_check_message(m, j, len(msgs), f"{where}, message {j + 1}") for j, m in enumerate(msgs)]
    leaf = c.get("leaf")
    if leaf is not None and not (type(leaf) is int and 0 <= leaf < len(msgs)):
        raise ImportFormatError(f"{where}: \"leaf\" names no message.")
    return {"title": title, "settings": settings, "pinned": bool(c.get("pinned", False)),
            "hidden": bool(c.get("hidden", False)), "created_at": _time(c.get("created_at"), where),
            "updated_at": _time(c.get("updated_at"), where), "leaf": leaf, "messages": checked}


def _check_settings(data, where: str) -> ChatSettings:
    if not isinstance(data, dict):
        raise ImportFormatError(f"{where}: settings must be an object.")
    for key, value in data.items():
        want = _SETTING_TYPES.get(key, (type(value),))  # a key this version does not know: ignored, as from_dict does
        ok = type(value) in want or (float in want and type(value) is int)
        if not ok or (isinstance(value, str) and len(value) > MAX_TEXT):
            raise ImportFormatError(f"{where}: setting {str(key)[:40]!r} has the wrong type.")
    try:
        return ChatSettings.from_dict(data)
    except (TypeError, ValueError, ParleyError) as exc:
        raise ImportFormatError(f"{where}: invalid settings ({exc}).") from None


# each setting's types from its annotation: a default of None read as "only null" refused a chat's thinking on or off
_SETTING_TYPES = {name: typing.get_args(hint) or (hint,) for name, hint in typing.get_type_hints(ChatSettings).items()}


def _check_message(m, j: int, n: int, where: str) -> dict:
    if not isinstance(m, dict):
        raise ImportFormatError(f"{where} is not an object.")
    if m.get("id") != j:
        raise ImportFormatError(f"{where}: ids must count 0, 1, 2, … in order.")
    parent = m.get("parent")
    if parent is not None and not (type(parent) is int and 0 <= parent < j):
        raise ImportFormatError(f"{where}: its parent must be an earlier message.")
    if m.get("role") not in ROLES:
        raise ImportFormatError(f"{where}: role must be one of {', '.join(ROLES)}.")
    state = m.get("state", "done")
    if state in UNFINISHED:
        state = "interrupted"
    if state not in STATES:
        raise ImportFormatError(f"{where}: unknown state {str(state)[:40]!r}.")
    stats = m.get("stats")
    if stats is not None and not (isinstance(stats, dict) and len(json.dumps(stats)) < 4096):
        raise ImportFormatError(f"{where}: stats must be a small object.")
    return {"parent": parent, "role": m["role"], "content": _text(m.get("content", ""), f"{where}: content"),
            "state": state, "error": _text(m.get("error", ""), f"{where}: error"), "stats": stats,
            "model": _text(m.get("model", ""), f"{where}: model"), "created_at": _time(m.get("created_at"), where)}


def _text(value, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ImportFormatError(f"{where} must be text of at most {MAX_TEXT:,} characters.")
    return value.encode("utf-8", "replace").decode("utf-8")  # lone surrogates become '?'


def _time(value, where: str) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ImportFormatError(f"{where}: times must be numbers.")
    return float(value)


def _add_chat(store: ConversationStore, c: dict) -> int:
    conv = store.create(c["title"], c["settings"], hidden=c["hidden"])
    ids: list[int] = []
    for m in c["messages"]:
        parent = ids[m["parent"]] if m["parent"] is not None else None
        msg = store.add_message(conv.id, parent, m["role"], m["content"], m["state"])
        changes = {k: m[k] for k in ("error", "model") if m[k]}
        if m["stats"] is not None:
            changes["stats"] = m["stats"]
        if m["created_at"] is not None:
            changes["created_at"] = m["created_at"]
        if changes:
            store.update_message(msg.id, **changes)
        ids.append(msg.id)
    times = {k: c[k] for k in ("created_at", "updated_at") if c[k] is not None}
    store.update(conv.id, pinned=c["pinned"], leaf_id=ids[c["leaf"]] if c["leaf"] is not None else None, **times)
    return conv.id
