"""One message as HTML for the chat view: header, body (an answer's Markdown, a user's text as typed), state notes and
its action links.

Links: `prev:`/`next:` switch versions, `edit:`, `regen:`, `copymsg:`, and `copy:N` for the n-th code block;
`open:URL` for a link of the message's text (app/core/markdown_render.py).
"""
from __future__ import annotations

import html
from dataclasses import dataclass

from app.core.conversations import Message
from app.core.live import can_continue
from app.core.markdown_render import MarkdownRenderer

STATE_NOTES = {
    "waiting": "Loading the model…",
    "queued": "Queued — waiting for a free slot",
    "stopped": "Stopped",
    "interrupted": "Interrupted — Parley closed before this answer finished",
}
CURSOR = "▍"


@dataclass(frozen=True, slots=True)
class Rendered:
    html: str
    code_blocks: list[str]


def message_html(msg: Message, version: int, versions: int, renderer: MarkdownRenderer, busy: bool) -> Rendered:
    """`version` is 1-based among `versions`; `busy` hides actions while the chat is answering."""
    render = renderer.render_typed if msg.role == "user" else renderer.render  # a user's text is shown as typed
    body, blocks = render(msg.content) if msg.content else ("", [])
    if msg.state == "streaming":
        body += f'<p style="color:#888">{CURSOR}</p>'
    parts = [_header(msg, version, versions, busy), body, _note(msg)]
    return Rendered("".join(parts), blocks)


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
    if not busy:
        actions.append(("Edit", "edit:") if msg.role == "user" else ("Regenerate", "regen:"))
    seed = (msg.stats or {}).get("seed")
    if not busy and msg.role == "assistant" and isinstance(seed, int):
        actions.append((f"Regenerate with seed {seed}", f"regen-seed:{seed}"))  # the same draws: this answer again
    return actions


def _header(msg: Message, version: int, versions: int, busy: bool) -> str:
    """Links right-aligned, those always there on the right: one appearing (Copy, Continue, the version
    arrows) never moves Regenerate or Edit out from under the pointer."""
    who = "You" if msg.role == "user" else html.escape(msg.model or "Assistant")
    seed = (msg.stats or {}).get("seed")
    if isinstance(seed, int):
        who += f' <span style="color:#8b949e; font-weight:normal">· seed {seed}</span>'
    links = []
    for label, href in message_actions(msg, version, versions, busy):
        if href in ("prev:", "next:") or href.startswith("regen-seed:"):
            continue  # arrows around the version count; repeating a seed is in the message's menu
        links.append(f'<a href="{href}">{label}</a>')
    if versions > 1:
        arrows = f'{_arrow("prev:", "‹", version > 1)} {version}/{versions} {_arrow("next:", "›", version < versions)}'
        links.insert(1 if links and links[0].startswith('<a href="continue:"') else 0, arrows)
    actions = " &nbsp; ".join(links)
    return (f'<table width="100%" cellspacing="0" cellpadding="0"><tr><td><b>{who}</b></td>'
            f'<td align="right">{actions}</td></tr></table>')


def _arrow(href: str, glyph: str, enabled: bool) -> str:
    """A version arrow big enough to hit (at text size it was 5 px wide), padded by spaces inside the link."""
    big = f'<span style="font-size:15pt; font-weight:bold">&nbsp;{glyph}&nbsp;</span>'
    if enabled:
        return f'<a href="{href}">{big}</a>'
    return f'<span style="color:#bbb">{big}</span>'


def accessible_text(msg: Message, version: int, versions: int) -> str:
    """What a screen reader says for a message: who, its state, which version, then the text."""
    who = "You" if msg.role == "user" else (msg.model or "Assistant")
    notes = [STATE_NOTES.get(msg.state, "").split(" —")[0] if msg.state != "done" else "",
             f"version {version} of {versions}" if versions > 1 else "",
             f"error: {msg.error}" if msg.state == "error" else ""]
    head = ", ".join([who, *filter(None, notes)])
    return f"{head}: {msg.content}" if msg.content else head


def _note(msg: Message) -> str:
    if msg.state == "error":
        return f'<p style="color:#d33"><b>Error:</b> {html.escape(msg.error or "the turn failed")}</p>'
    if msg.state == "queued":
        detail = f" ({html.escape(msg.error)})" if msg.error else ""
        return f'<p style="color:#b58900"><i>{STATE_NOTES["queued"]}{detail}</i></p>'
    if msg.state in STATE_NOTES:
        return f'<p style="color:#888"><i>{STATE_NOTES[msg.state]}</i></p>'
    reason = (msg.stats or {}).get("reason")
    if reason in ("length", "context_full"):
        why = "max tokens reached" if reason == "length" else "the context is full"
        return f'<p style="color:#888"><i>Cut short: {why}</i></p>'
    if msg.error:
        return f'<p style="color:#d33">{html.escape(msg.error)}</p>'
    return ""
