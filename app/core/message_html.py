"""One message as HTML for the chat view: header, body (an answer's Markdown, a user's text as typed), state notes and
its action links.

Links: `prev:`/`next:` switch versions, `edit:`, `regen:`, `copymsg:`, and `copy:N` for the n-th code block;
`open:URL` for a link of the message's text (app/core/markdown_render.py); `think:` shows or hides a reasoning model's
thought (app/core/reasoning.py), which streams in view and folds away once the reply begins.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass

from app.core.chats import AGAIN, unseen_messages
from app.core.conversations import Message, failed_unanswered
from app.core.live import can_continue
from app.core.markdown_render import QUOTE_TEXT, RULE_COLOR, MarkdownRenderer
from app.core.reasoning import Reasoning, split_reasoning

STATE_NOTES = {
    "waiting": "Loading the model…",
    "queued": "Queued — waiting for a free slot",
    "stopped": "Stopped",
    "interrupted": "Interrupted — Parley closed before this answer finished",
}
CURSOR = "▍"
# a Chinese or Japanese character (those scripts put no spaces between words: word processors count characters), or a
# run of other characters between spaces; _words keeps those with a letter or digit (not "—" or "。")
WORD = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\s\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


@dataclass(frozen=True, slots=True)
class Rendered:
    html: str
    code_blocks: list[str]
    parts: tuple[str, ...] = ()  # html cut where a streaming answer changes (header, thought, each block, tail)
    complete: bool = True  # False: a streaming answer's first blocks only, its deadline spent (the rest comes next)


# notes' colours at WCAG AA contrast (4.5:1) on the message background of each theme: #d33, #b58900 and #888 gave
# 3.7:1 (error, dark), 3.2:1 (queued, light) and 3.5:1 (notes, light)
NOTE_COLOR = {"error": {False: "#c62828", True: "#ff7b72"}, "queued": {False: "#8a6100", True: "#e3b341"},
              "muted": {False: "#656d76", True: "#8b949e"}}


@dataclass(frozen=True, slots=True)
class Names:
    """How an answer names models now: `wrote`, its model as the model list names it (an older file saved the file's
    own name); `now`, the chat's model, which Retry, Continue and Regenerate answer with. Empty: as saved."""

    wrote: str = ""
    now: str = ""


def message_html(msg: Message, version: int, versions: int, renderer: MarkdownRenderer, busy: bool,
                 show_thought: bool = False, deadline: float | None = None, names: Names = Names(),
                 narrow: bool = False) -> Rendered:
    """`version` is 1-based among `versions`; `busy` hides actions while the chat is answering; `show_thought` unfolds
    a finished thought; past `deadline` (time.perf_counter()) a streaming answer renders no more new blocks; `narrow`
    puts an answer's links under its model's name (a compare column)."""
    complete = True
    if msg.role == "user":  # a user's text is shown as typed
        typed, blocks = renderer.render_typed(msg.content) if msg.content else ("", [])
        body, thought = [typed], ""
    else:
        reasoning = split_reasoning(msg.content)
        if not reasoning.reply:
            body, blocks = [], []
        elif msg.state == "streaming":
            body, blocks, complete = renderer.render_streaming_parts(reasoning.reply, deadline)
        else:
            body, blocks = renderer.render_parts(reasoning.reply)
        thought = _thought(reasoning, msg.state == "streaming", show_thought, renderer.dark)
    tail = _note(msg, renderer.dark, names) + _unseen_note(msg, renderer.dark)
    if msg.state == "streaming":
        tail = f'<p style="color:#888">{CURSOR}</p>' + tail
    if body:  # the tail goes in with the last block: alone, Qt would end a list or table before it in another block
        body[-1] += tail
    parts = (_header(msg, version, versions, busy, names, narrow), thought, *(body or [tail]))
    return Rendered("".join(parts), blocks, parts, complete)


def _thought(reasoning: Reasoning, streaming: bool, shown: bool, dark: bool) -> str:
    """The thought's line ("Thinking…" while it streams, then its length and a Show/Hide link) and, while it streams
    or when shown, its text as written, dimmed beside a bar."""
    live = reasoning.thinking and streaming
    if reasoning.thought is None or not (reasoning.thought or live):  # an empty thought has nothing to show
        return ""
    words = _words(reasoning.thought)
    label = "Thinking…" if live else f"Thought for {words} word{'s' if words != 1 else ''}"
    link = "" if live else f' &nbsp; <a href="think:">{"Hide" if shown else "Show"}</a>'
    head = f'<p style="color:{NOTE_COLOR["muted"][dark]}"><i>{label}</i>{link}</p>'
    if not (live or shown) or not reasoning.thought:
        return head
    text = html.escape(reasoning.thought).replace("\n", "<br>")
    return (f'{head}<table width="100%" cellspacing="0" cellpadding="0" style="margin-bottom:6px"><tr>'
            f'<td width="3" bgcolor="{RULE_COLOR[dark]}"></td><td width="10"></td>'
            f'<td style="color:{QUOTE_TEXT[dark]}; white-space:pre-wrap">{text}</td></tr></table>')


def _words(text: str) -> int:
    return sum(1 for word in WORD.findall(text) if any(c.isalnum() for c in word))


def message_actions(msg: Message, version: int, versions: int, busy: bool) -> list[tuple[str, str]]:
    """(label, link) of what can be done with a message, in the order shown: the same for the links, the
    message's context menu and the keyboard."""
    actions = []
    if not busy and can_continue(msg):
        actions.append(("Continue", "continue:"))
    if version > 1:
        actions.append(("Previous version", "prev:"))
    if version < versions:
        actions.append(("Next version", "next:"))
    if msg.content:
        actions.append(("Copy", "copymsg:"))
    reasoning = split_reasoning(msg.content) if msg.role == "assistant" else None
    if reasoning is not None and reasoning.thought and not (reasoning.thinking and msg.state == "streaming"):
        actions.append(("Show or hide the thinking", "think:"))
    if not busy:
        again = "Retry" if failed_unanswered(msg) else "Regenerate"
        actions.append(("Edit", "edit:") if msg.role == "user" else (again, "regen:"))
    seed = (msg.stats or {}).get("seed")
    if not busy and msg.role == "assistant" and isinstance(seed, int):
        actions.append((f"Regenerate with seed {seed}", f"regen-seed:{seed}"))  # the same draws: this answer again
    return actions


def _header(msg: Message, version: int, versions: int, busy: bool, names: Names, narrow: bool = False) -> str:
    """Links right-aligned, those always there on the right: one appearing (Copy, Continue, the version
    arrows) never moves Regenerate or Edit out from under the pointer. `narrow`: an answer's links on a row of their
    own, under the name (beside it, in a 200 px column, the name and the links each wrapped: six lines before the
    answer)."""
    who = "You" if msg.role == "user" else html.escape(_writer(msg, names))
    seed = (msg.stats or {}).get("seed")
    if isinstance(seed, int):
        who += f' <span style="color:#8b949e; font-weight:normal">· seed {seed}</span>'
    links = []
    for label, href in message_actions(msg, version, versions, busy):
        if href in ("prev:", "next:", "think:") or href.startswith("regen-seed:"):
            continue  # arrows around the version count; the thought's own line; repeating a seed is in the menu
        links.append(f'<a href="{href}">{label}</a>')
    if versions > 1:
        arrows = f'{_arrow("prev:", "‹", version > 1)} {version}/{versions} {_arrow("next:", "›", version < versions)}'
        links.insert(1 if links and links[0].startswith('<a href="continue:"') else 0, arrows)
    actions = " &nbsp; ".join(links)
    between = "</tr><tr>" if narrow and msg.role == "assistant" else ""
    return (f'<table width="100%" cellspacing="0" cellpadding="0"><tr><td><b>{who}</b></td>{between}'
            f'<td align="right">{actions}</td></tr></table>')


def _arrow(href: str, glyph: str, enabled: bool) -> str:
    """A version arrow big enough to hit (at text size it was 5 px wide), padded by spaces inside the link."""
    big = f'<span style="font-size:15pt; font-weight:bold">&nbsp;{glyph}&nbsp;</span>'
    if enabled:
        return f'<a href="{href}">{big}</a>'
    return f'<span style="color:#bbb">{big}</span>'


def _writer(msg: Message, names: Names) -> str:
    return names.wrote or msg.model or "Assistant"


def error_text(msg: Message, names: Names) -> str:
    """The error or stop note as shown: an unload's "Retry loads it again" said of the model that answered; with
    another model picked since, Retry (Continue, Regenerate) answers with that one, and the note says so."""
    if not (names.now and AGAIN in msg.error and names.now != _writer(msg, names)):
        return msg.error
    return msg.error.replace(AGAIN, f"uses {names.now}, the chat's model now")


def accessible_text(msg: Message, version: int, versions: int, names: Names = Names()) -> str:
    """What a screen reader says for a message: who, its state, which version, then the text."""
    who = "You" if msg.role == "user" else _writer(msg, names)
    reasoning = split_reasoning(msg.content) if msg.role == "assistant" else None
    notes = [STATE_NOTES.get(msg.state, "").split(" —")[0] if msg.state != "done" else "",
             _thought_note(reasoning, msg.state == "streaming"),
             f"version {version} of {versions}" if versions > 1 else "",
             f"error: {error_text(msg, names)}" if msg.state == "error" else "",
             _unseen_said(msg)]
    head = ", ".join([who, *filter(None, notes)])
    text = reasoning.reply if reasoning is not None else msg.content
    return f"{head}: {text}" if text else head


def _thought_note(reasoning: Reasoning | None, streaming: bool) -> str:
    """The thought line for a screen reader (which reads the reply only): thinking, or the thought's length."""
    if reasoning is None or not reasoning.thought and not (reasoning.thinking and streaming):
        return ""
    if reasoning.thinking:
        return "thinking" if streaming else "cut short while thinking"
    words = _words(reasoning.thought)
    return f"thought for {words} word{'s' if words != 1 else ''}"


def _thought_hint(msg: Message) -> str:
    """What gets an answer whose thought was cut short: Continue where it is offered; a full context takes no more
    tokens, so a shorter try (no thinking) or a fresh chat."""
    if can_continue(msg):
        return "Continue, or raise Max tokens or turn Thinking off in the chat settings"
    return "Turn Thinking off in the chat settings and Regenerate, or start a new chat"


def _unseen_said(msg: Message) -> str:
    """The note below for a screen reader, which reads the reply only."""
    dropped = unseen_messages(msg.stats) if msg.role == "assistant" else 0
    return f"written without the chat's {dropped:,} oldest message{'s' if dropped != 1 else ''}" if dropped else ""


def _unseen_note(msg: Message, dark: bool) -> str:
    """An answer written without the chat's oldest messages says so: the context meter read "63 / 4,096" under an
    answer to a 600-message chat that the model had not seen a word of."""
    dropped = unseen_messages(msg.stats)
    if not dropped or msg.role != "assistant":
        return ""
    limit = (msg.stats or {}).get("context_limit")
    fits = f" of {limit:,} tokens" if isinstance(limit, int) and limit > 0 else ""
    which = "oldest message: it does" if dropped == 1 else f"{dropped:,} oldest messages: they do"
    return (f'<p style="color:{NOTE_COLOR["muted"][dark]}"><i>Written without the chat\'s {which} not fit its '
            f'context{fits}.</i></p>')


def _note(msg: Message, dark: bool, names: Names = Names()) -> str:
    error, queued, muted = (NOTE_COLOR[k][dark] for k in ("error", "queued", "muted"))
    said = error_text(msg, names)
    if msg.state == "error":
        return f'<p style="color:{error}"><b>Error:</b> {html.escape(said or "the turn failed")}</p>'
    if msg.state == "queued":
        detail = f" ({html.escape(msg.error)})" if msg.error else ""
        return f'<p style="color:{queued}"><i>{STATE_NOTES["queued"]}{detail}</i></p>'
    if msg.state in STATE_NOTES:
        why = f": {html.escape(said)}" if said else ""  # a stop the user did not ask for says why
        return f'<p style="color:{muted}"><i>{STATE_NOTES[msg.state]}{why}</i></p>'
    reason = (msg.stats or {}).get("reason")
    if reason in ("length", "context_full"):
        why = "max tokens reached" if reason == "length" else "the context is full"
        if msg.role == "assistant" and split_reasoning(msg.content).thinking:  # the reply never began
            return f'<p style="color:{muted}"><i>Cut short while thinking: {why}. {_thought_hint(msg)}.</i></p>'
        return f'<p style="color:{muted}"><i>Cut short: {why}</i></p>'
    if said:
        return f'<p style="color:{error}">{html.escape(said)}</p>'
    return ""
