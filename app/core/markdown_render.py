"""Markdown -> the HTML subset QTextDocument draws, with Pygments-highlighted code blocks and copy links.

No Qt here: the output is a string plus the raw text of each code block (for the copy links).
Raw HTML in model output is escaped, never rendered.
"""
from __future__ import annotations

import functools
import html

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

CODE_STYLES = {False: "friendly", True: "monokai"}
COMMON_LANGUAGES = ("python", "bash", "json", "javascript", "c", "cpp", "rust", "html")
CODE_BACKGROUND = {False: "#f3f4f6", True: "#23241f"}


class MarkdownRenderer:
    def __init__(self, dark: bool = False):
        self.dark = dark
        self._formatter = HtmlFormatter(noclasses=True, nowrap=True, style=CODE_STYLES[dark])
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table").enable("strikethrough")
        fence = lambda *args: self._fence(args[-4], args[-3], args[-1])  # noqa: E731 (markdown-it binds rules to its renderer)
        self._md.add_render_rule("fence", fence)
        self._md.add_render_rule("code_block", fence)
        _warm_lexers()

    def render(self, text: str) -> tuple[str, list[str]]:
        """(html, code blocks): the n-th block's copy link is `copy:n`."""
        env = {"code_blocks": []}
        body = self._md.render(text, env)
        return body, env["code_blocks"]

    def _fence(self, tokens, idx, env) -> str:
        token = tokens[idx]
        code = token.content
        lang = token.info.strip().split(" ")[0] if token.info else ""
        n = len(env["code_blocks"])
        env["code_blocks"].append(code)
        body = highlight(code, self._lexer(lang, code), self._formatter)
        label = html.escape(lang or "code")
        bg = CODE_BACKGROUND[self.dark]
        return (
            f'<table width="100%" cellspacing="0" cellpadding="6" bgcolor="{bg}" style="margin-top:4px">'
            f'<tr><td><span style="color:#8b949e">{label}</span></td>'
            f'<td align="right"><a href="copy:{n}">Copy</a></td></tr>'
            f'<tr><td colspan="2"><pre style="margin:0">{body}</pre></td></tr></table>\n'
        )

    @staticmethod
    def _lexer(lang: str, code: str):
        # No guessing for unlabelled blocks: guess_lexer tries every lexer (tens of ms), and a streaming
        # answer is re-rendered many times a second.
        try:
            return get_lexer_by_name(lang) if lang else TextLexer()
        except ClassNotFound:
            return TextLexer()


@functools.cache
def _warm_lexers() -> None:
    """Imports the common lexers once, when the window is built, not mid-stream (the first import costs ~50 ms)."""
    for name in COMMON_LANGUAGES:
        get_lexer_by_name(name)
