"""One message as HTML for the chat view: header, Markdown body, state notes and its action links.

Links: `prev:`/`next:` switch versions, `edit:`, `regen:`, `copymsg:`, and `copy:N` for the n-th code block.
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
    body, blocks = renderer.render(msg.content) if msg.content else ("", [])
    if msg.state == "streaming":
        body += f'<p style="color:#888">{CURSOR}</p>'
    parts = [_header(msg, version, versions, busy), body, _note(msg)]
    return Rendered("".join(parts), blocks)


def _header(msg: Message, version: int, versions: int, busy: bool) -> str:
    who = "You" if msg.role == "user" else html.escape(msg.model or "Assistant")
    links = []
    if versions > 1:
        prev = '<a href="prev:">‹</a>' if version > 1 else '<span style="color:#999">‹</span>'
        nxt = '<a href="next:">›</a>' if version < versions else '<span style="color:#999">›</span>'
        links.append(f"{prev} {version}/{versions} {nxt}")
    if not busy:
        links.append('<a href="edit:">Edit</a>' if msg.role == "user" else '<a href="regen:">Regenerate</a>')
        if can_continue(msg):
            links.append('<a href="continue:">Continue</a>')
    if msg.content:
        links.append('<a href="copymsg:">Copy</a>')
    actions = " &nbsp; ".join(links)
    return (f'<table width="100%" cellspacing="0" cellpadding="0"><tr><td><b>{who}</b></td>'
            f'<td align="right">{actions}</td></tr></table>')


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
