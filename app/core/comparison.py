"""A comparison's text side, no Qt: its title, its export as Markdown, and a word diff of two answers."""
from __future__ import annotations

import difflib
import html
import re
import time

from app.core.chat_settings import differences
from app.core.conversations import ConversationStore

TITLE_CHARS = 60
# Chinese and Japanese put no spaces between words: each of their characters counts as a word of its own
CJK = "\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef\U00020000-\U0002fa1f"
PIECES = re.compile(rf"\s*(?:[{CJK}]|[^\s{CJK}]+)|\s+")  # a word with the space before it
EXACT_PAIRS = 1_000_000  # words × words up to which the matching is exact (~1,000-word answers, under a second)


def group_title(store: ConversationStore, conv_ids: list[int]) -> str:
    """The first prompt of the comparison, or "Empty comparison"."""
    for conv_id in conv_ids:
        path = store.path(conv_id) if store.has(conv_id) else []
        if path:
            line = " ".join(path[0].content.split())
            return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"
    return "Empty comparison"


def has_messages(store: ConversationStore, conv_ids: list[int]) -> bool:
    return any(store.has(c) and store.path(c) for c in conv_ids)


def column_labels(store: ConversationStore, conv_ids: list[int], model_names: list[str]) -> list[str]:
    """ "A: qwen3 · T 0.2" per column: its letter, model and the settings in which the columns differ."""
    settings = [store.get(c).settings for c in conv_ids]
    return [" · ".join([f"{chr(ord('A') + i)}: {name}", *diff])
            for i, (name, diff) in enumerate(zip(model_names, differences(settings)))]


def column_letters(store: ConversationStore) -> dict[int, str]:
    """Every comparison's columns by their letter, as the compare view shows them (A, B, …)."""
    return {c: chr(ord("A") + i) for members in store.compare_groups().values() for i, c in enumerate(members)}


def left_behind(store: ConversationStore, conv_ids: list[int]) -> tuple[list[int], str]:
    """The columns still without the comparison's latest prompt (Parley closed while they waited their turn in
    one-at-a-time mode), and that prompt: each has every earlier prompt of the column furthest on, but not it."""
    prompts = [[m.content for m in store.path(c) if m.role == "user"] if store.has(c) else [] for c in conv_ids]
    latest = max(prompts, key=len, default=[])
    behind = [c for c, p in zip(conv_ids, prompts) if latest and p == latest[:-1]]
    return behind, latest[-1] if behind else ""


def chats_and_comparisons(store: ConversationStore, conv_ids: list[int]) -> tuple[int, int]:
    """Conversations counted as the user sees them: the chats of the sidebar, and the comparisons whose columns
    (hidden conversations) they are, each once."""
    hidden = {c for c in conv_ids if store.get(c).hidden}
    groups = sum(1 for members in store.compare_groups().values() if hidden & set(members))
    return len(conv_ids) - len(hidden), groups


def comparison_markdown(store: ConversationStore, conv_ids: list[int], labels: list[str]) -> str:
    """Turn by turn: each prompt once, then every column's answer under its label."""
    paths = [store.path(c) for c in conv_ids]
    lines = [f"# Comparison: {group_title(store, conv_ids)}", "",
             f"_Exported from Parley on {time.strftime('%Y-%m-%d %H:%M')}._", "", "Columns:", ""]
    lines += [f"- {label}" for label in labels] + [""]
    turns = max((len(p) + 1) // 2 for p in paths) if paths else 0
    for turn in range(turns):
        prompts = {p[2 * turn].content for p in paths if len(p) > 2 * turn}
        lines += [f"## Turn {turn + 1}", ""]
        for prompt in sorted(prompts):
            lines += ["**You:**", "", _quote(prompt), ""]
        for label, path in zip(labels, paths):
            answer = path[2 * turn + 1] if len(path) > 2 * turn + 1 else None
            figures = _figures(answer.stats) if answer else ""
            lines += [f"### {label}", "", *([figures, ""] if figures else []),
                      answer.content if answer and answer.content else "_(no answer)_", ""]
    return "\n".join(lines).rstrip() + "\n"


def _figures(stats: dict | None) -> str:
    """ "_48 tokens · 21.3 tok/s · TTFT 133 ms_": an answer's saved figures, which the columns' lines showed and an
    export left out."""
    stats = stats or {}
    parts = [f"{stats['completion_tokens']:,} tokens" if stats.get("completion_tokens") else "",
             f"{stats['tokens_per_s']:.1f} tok/s" if stats.get("tokens_per_s") else "",
             f"TTFT {stats['ttft_s'] * 1000:.0f} ms" if stats.get("ttft_s") is not None else ""]
    shown = " · ".join(filter(None, parts))
    return f"_{shown}_" if shown else ""


def _quote(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines() or [""])


def word_diff_html(old: str, new: str) -> str:
    """Both answers' words, those only in `old` struck through in red, those only in `new` in green."""
    return word_diff(old, new)[0]


def similarity(old: str, new: str) -> float:
    """How much of the two answers' words agree, 0..1."""
    return word_diff(old, new)[1]


def word_diff(old: str, new: str) -> tuple[str, float]:
    """The word diff as HTML and how much of the two answers' words agree (0..1), from one matching."""
    a, b = PIECES.findall(old), PIECES.findall(new)
    # exact matching grows with the square of the length (two 2,000-word answers took minutes, spaces matched as
    # words); longer answers take difflib's heuristic for frequent words, which aligns well on words without spaces
    exact = len(a) * len(b) <= EXACT_PAIRS
    matcher = difflib.SequenceMatcher(None, [p.strip() for p in a], [p.strip() for p in b], autojunk=not exact)
    out = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            out.append(_text("".join(b[j1:j2])))
            continue
        gone, added = "".join(a[i1:i2]), "".join(b[j1:j2])
        out.append(_text(_lead(added or gone)))  # the space before a change is not part of it
        if gone:
            out.append(f'<span style="background:#ffd7d5; color:#82071e"><s>{_text(gone.lstrip())}</s></span>')
        if added:
            out.append(f'<span style="background:#ccffd8; color:#055d20">{_text(added.lstrip())}</span>')
    return "".join(out), matcher.ratio()


def _lead(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def _text(text: str) -> str:
    return html.escape(text).replace("\n", "<br>")
