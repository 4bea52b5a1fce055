"""Markdown -> the HTML subset QTextDocument draws, with Pygments-highlighted code blocks and copy links.

No Qt here: the output is a string plus the raw text of each code block (for the copy links).
Raw HTML in model output is escaped, never rendered. Images are never loaded (a local path such as
/dev/zero would be read on every render): they show as their alt text. `$…$` / `$$…$$` math is shown as
Unicode text (app/core/tex_text.py); tables get borders and padding, block quotes a bar. A single newline breaks
the line (CommonMark would join the lines: a poem, an address or a pasted list would run together). Links open in
the browser (web and mail only), through their own `open:` verb. A user's own text is shown as typed
(`render_typed`): pasted code keeps its indentation and `__init__` its underscores; only fenced blocks are code.
"""
from __future__ import annotations

import functools
import html
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from app.core.code_runs import FIRST, LexState, Run, Segment, format_tokens, highlight_segment, split_lines
from app.core.growing_block import GrowingBlocks
from app.core.tex_text import tex_html

CODE_STYLES = {False: "friendly", True: "monokai"}
COMMON_LANGUAGES = ("python", "bash", "json", "javascript", "c", "cpp", "rust", "html")
CODE_BACKGROUND = {False: "#f3f4f6", True: "#23241f"}
RULE_COLOR = {False: "#c9ced6", True: "#4a505c"}  # table borders and the block-quote bar
CELL_COLOR = {False: "#ffffff", True: "#1b1d22"}  # a table cell's background where the view names none (its bubble's)
QUOTE_TEXT = {False: "#57606a", True: "#a8b0bc"}
STREAM_HIGHLIGHT_LINES = 200  # a longer code block of a streaming answer is highlighted once the answer ends
STREAM_CACHE = 4096  # finished blocks of streaming answers kept rendered (several chats stream at once)
STREAM_PREFIXES = 8  # streaming answers whose settled blocks are remembered (a chat view shows one, compare columns 4)
# a growing code block is highlighted (and put in its document) in runs of lines, the finished runs once each: its last
# run is highlighted, parsed and laid out again on every token (25 lines: ~7 ms a token here)
STREAM_SEGMENT_LINES = 10
RUN_SEAM = "\x00"  # between the tables of an answer's code block's runs (markdown-it turns a text's NUL into U+FFFD)
# Markdown a call past its deadline still renders: one block a call, under load (the deadline spent before the first
# block), put a 22,000-character answer of 750 short blocks on screen in 750 turns of the event loop (~40 s here)
CATCH_UP_CHARS = 1_500
FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
BRACKETS = {"$$": "$$", "\\[": "\\]", "\\(": "\\)"}  # math's opening delimiter -> its closing one
MAX_QUOTE_BARS = 4  # block quotes nested deeper are indented without their bar (a table each: 20 took Qt a minute)
MAIL_FIELDS = {"to", "cc", "bcc", "subject", "body"}  # a mailto: link's fields that only fill in a message
STREAMED_NEW = 8  # rows or items of a complete table or list not rendered as it streamed: more, and it renders whole
LIST_ITEM = re.compile(r"([-+*]|\d{1,9}[.)])(\s|$)")


@dataclass(frozen=True, slots=True)
class _Prefix:
    """The start of a streaming answer whose blocks no later text changes, rendered: the next update renders only what
    follows it (splitting and looking up all of a 60,000-character answer's blocks again took ~10 ms a token here)."""

    text: str
    blocks: list[_Block]


@dataclass(frozen=True, slots=True)
class _Block:
    """One block of an answer rendered."""

    html: str
    parts: tuple[str, ...]  # its HTML cut where the view's document may take it apart (a code block's runs)
    code_blocks: list[str]
    final: bool  # as the finished answer shows it (a long code block is highlighted only once the answer ends)
    references: bool  # it defines a reference link, which a link in any other block may use


class MarkdownRenderer:
    def __init__(self, dark: bool = False, background: str | None = None):
        """`background`: the colour an answer is drawn on (a table's cells take it)."""
        self.dark = dark
        self._cell = background or CELL_COLOR[dark]
        self._formatter = HtmlFormatter(noclasses=True, nowrap=True, style=CODE_STYLES[dark])
        self._md = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True})
        self._md.enable("table").enable("strikethrough")
        fence = lambda *args: self._fence(args[-4], args[-3], args[-1])  # noqa: E731 (markdown-it binds rules to its renderer)
        self._md.add_render_rule("fence", fence)
        self._md.add_render_rule("code_block", fence)
        self._md.block.ruler.before("fence", "math_block", _math_block,
                                    {"alt": ["paragraph", "reference", "blockquote", "list"]})
        self._md.inline.ruler.before("escape", "math_inline", _math_inline)
        rules = {"math_inline": lambda t, i: f'<span style="font-family:serif">{tex_html(t[i].content)}</span>',
                 "math_block": lambda t, i: f'<p align="center" style="font-family:serif">{tex_html(t[i].content)}</p>\n',
                 "image": self._image, "link_open": _link_open, "table_open": self._table_open,
                 "th_open": self._cell_open, "td_open": self._cell_open}
        for name, rule in rules.items():
            self._md.add_render_rule(name, lambda *args, rule=rule: rule(args[-4], args[-3]))
        self._md.add_render_rule("blockquote_open", lambda *args: self._quote_open(args[-1]))
        self._md.add_render_rule("blockquote_close", lambda *args: _quote_close(args[-1]))
        self._typed = MarkdownIt("zero").enable("fence")  # finds a user's fenced blocks, nothing else
        self._finished: OrderedDict[tuple[str, int], _Block] = OrderedDict()  # complete blocks of answers
        # growing code blocks' runs of lines, a segment at a time (app/core/code_runs.py)
        self._runs: OrderedDict[tuple[tuple[str, ...], str, LexState], Segment] = OrderedDict()
        self._prefixes: list[_Prefix] = []  # streaming answers' blocks that stay as they are, the latest first
        self._growing = GrowingBlocks(self._md, RUN_SEAM)  # a growing table's rows and list's items, rendered once each
        _warm_lexers()

    def render(self, text: str) -> tuple[str, list[str]]:
        """(html, code blocks): the n-th block's copy link is `copy:n`."""
        env = {"code_blocks": []}
        body = self._md.render(text, env)
        return body, env["code_blocks"]

    def render_streaming(self, text: str) -> tuple[str, list[str]]:
        """render() of an answer still streaming, at a cost that follows its last block, not its length (re-rendering a
        50,000-character answer on every token froze the window): the blocks before its last blank line outside code
        are rendered once and reused, and a code block over STREAM_HIGHLIGHT_LINES lines is highlighted at the end.
        Blocks render apart, so a reference link defined further down resolves once the answer ends."""
        parts, blocks, _ = self.render_streaming_parts(text)
        return "".join(parts), blocks

    def render_streaming_parts(self, text: str, deadline: float | None = None) -> tuple[list[str], list[str], bool]:
        """render_streaming()'s HTML one string a block (the view edits its document where they changed), and whether
        that is all of it: past `deadline` (time.perf_counter()), once CATCH_UP_CHARS of new blocks are rendered, no other
        block not rendered before is, and those before it are the parts (a chat opened mid-answer rendered all of a
        60,000-character one at once: ~250 ms here)."""
        done = max((p for p in self._prefixes if text.startswith(p.text)), key=lambda p: len(p.text), default=_Prefix("", []))
        chunks = _split_blocks(text[len(done.text):])
        first_code = sum(len(block.code_blocks) for block in done.blocks)
        rendered = done.blocks + self._render_chunks(chunks, final=False, deadline=deadline, first_code=first_code,
                                                     total=len(done.blocks) + len(chunks))
        self._keep_prefix(done, chunks, rendered)
        return ([part for block in rendered for part in block.parts],
                [code for block in rendered for code in block.code_blocks], len(rendered) == len(done.blocks) + len(chunks))

    def _keep_prefix(self, done: _Prefix, chunks: list[str], rendered: list[_Block]) -> None:
        """Remembers the blocks of a streaming answer that no later text changes: all but its last (and the one before
        that while the last is on its first line, whose first characters decide whether it starts a block)."""
        stable = len(chunks) - (1 if "\n" in chunks[-1] else 2)
        stable = min(stable, len(rendered) - len(done.blocks))
        if stable <= 0:
            return
        prefix = _Prefix(done.text + "".join(chunks[:stable]), rendered[:len(done.blocks) + stable])
        self._prefixes = [prefix] + [p for p in self._prefixes if p is not done][:STREAM_PREFIXES - 1]

    def render_parts(self, text: str) -> tuple[list[str], list[str]]:
        """render()'s HTML one string a block, joined the very same but for a code block of an answer, a table a run of
        lines drawn as render()'s one table: a streamed answer's blocks are reused when it ends (rendering all of a
        60,000-character one again took ~250 ms here). Blocks render apart as they do together unless a reference link
        is defined (it resolves anywhere in the text): then it is one part, rendered whole."""
        rendered = self._render_chunks(_split_blocks(text), final=True)
        if any(block.references for block in rendered):
            whole, blocks = self.render(text)
            return [whole], blocks
        return ([part for block in rendered for part in block.parts],
                [code for block in rendered for code in block.code_blocks])

    def _render_chunks(self, chunks: list[str], final: bool, deadline: float | None = None, first_code: int = 0,
                       total: int = 0) -> list[_Block]:
        rendered, new = [], 0
        for i, chunk in enumerate(chunks):
            if (chunk, first_code) not in self._finished:  # CATCH_UP_CHARS at least a call, whatever the time
                if new >= CATCH_UP_CHARS and deadline is not None and time.perf_counter() > deadline:
                    break
                new += len(chunk)
            rendered.append(self._render_block(chunk, first_code, keep=final or i < len(chunks) - 1, final=final))
            first_code += len(rendered[-1].code_blocks)
        while len(self._finished) > max(STREAM_CACHE, total or len(chunks)):  # never this answer's own: each update needs them
            self._finished.popitem(last=False)
        return rendered

    def _render_block(self, text: str, first_code: int, keep: bool, final: bool) -> _Block:
        """One block of an answer; `first_code` numbers its code blocks' copy links after the earlier ones. A block
        with another after it (`keep`) is complete: rendered once, as the finished answer shows it (but for a code
        block over STREAM_HIGHLIGHT_LINES lines while the answer streams)."""
        key = (text, first_code)
        hit = self._finished.get(key)
        if hit is not None and (hit.final or not final):
            self._finished.move_to_end(key)
            return hit
        env = {"code_blocks": [""] * first_code, "streaming": not final, "growing": not keep, "runs": True}
        # a table or list once complete keeps the rows and items it streamed in (rendered whole: ~20-40 ms at 200-300)
        joined = self._growing.render(text, env, None if not keep and not final else STREAMED_NEW)
        parts = tuple((self._md.render(text, env) if joined is None else joined).split(RUN_SEAM))
        block = _Block("".join(parts), parts, env["code_blocks"][first_code:], final=not env.get("deferred"),
                       references=bool(env.get("references")))
        if keep:  # the last block still grows: keeping each of its versions would only fill the cache
            self._finished[key] = block
            self._finished.move_to_end(key)
        return block

    def render_typed(self, text: str) -> tuple[str, list[str]]:
        """(html, code blocks) of text shown as typed, spaces and line breaks kept, fenced code blocks as code:
        what a user pasted into a message, which is rarely meant as Markdown."""
        env = {"code_blocks": []}
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # the lines markdown-it's maps count
        tokens = self._typed.parse(text)
        parts, line = [], 0
        for idx, token in enumerate(tokens):
            if token.type == "fence" and token.map and token.content:  # an empty or bare ``` stays text
                start, end = token.map
                parts += [_verbatim(lines[line:start]), self._fence(tokens, idx, env)]
                line = end
        parts.append(_verbatim(lines[line:]))
        return "".join(parts), env["code_blocks"]

    def _fence(self, tokens, idx, env) -> str:
        token = tokens[idx]
        code = token.content
        lang = token.info.strip().split(" ")[0] if token.info else ""
        n = len(env["code_blocks"])
        env["code_blocks"].append(code)
        long = env.get("streaming") and code.count("\n") > STREAM_HIGHLIGHT_LINES  # re-highlighting it per token stalled
        if long:
            env["deferred"] = True  # not as the finished answer shows it
        if env.get("streaming") and env.get("growing"):
            runs = [run.html for run in self._highlighted_runs(code, "" if long else lang)[0]]
        elif not long and ((_run_texts(code)[0],), lang, FIRST) in self._runs:  # a block that streamed: its runs reused
            runs = self._finished_runs(code, lang)
        else:
            runs = _runs_of(highlight(code, TextLexer() if long else self._lexer(lang, code), self._formatter))
        if not env.get("runs") or token.level:  # a user's text, or a block inside a list or a quote: one table
            runs = ["".join(runs)]
        label = html.escape(lang or "code")
        return RUN_SEAM.join(self._code_table(body, label, n, i, len(runs)) for i, body in enumerate(runs))

    def _code_table(self, body: str, label: str, n: int, run: int = 0, runs: int = 1) -> str:
        """A code block's table: its label and Copy link, then its code. An answer's block is a table a run of lines
        (`run` of `runs`), the seams without padding or margin: drawn as one table, while it grows only its last run
        goes in again (each token laid all of one table out again and parsed its HTML: ~25 ms at 199 lines on a 2-core
        Xeon), and when the answer ends the runs whose highlighting did not change stay."""
        bg = CODE_BACKGROUND[self.dark]
        seams = "; ".join(side for side, on in (("padding-top:0", run > 0), ("padding-bottom:0", run < runs - 1)) if on)
        cell = f'<td colspan="2" style="{seams}">' if seams else '<td colspan="2">'
        head = (f'<tr><td><span style="color:#8b949e">{label}</span></td>'
                f'<td align="right"><a href="copy:{n}">Copy</a></td></tr>') if run == 0 else ""
        return (
            f'<table width="100%" cellspacing="0" cellpadding="6" bgcolor="{bg}" '
            f'style="margin-top:{0 if run else 4}px">'
            f'{head}'
            # pre-wrap: a long line wraps inside the bubble (unwrapped it widened the table past the bubble's edge,
            # clipping the line and the Copy link); spaces and tabs are kept either way
            f'<tr>{cell}<pre style="margin:0; white-space:pre-wrap">{body}</pre></td></tr></table>\n'
        )

    def _highlighted_runs(self, code: str, lang: str, keep_last: bool = False) -> tuple[list[Run], bool]:
        """highlight() of a code block still growing, a run of STREAM_SEGMENT_LINES lines at a time: the runs before
        the last are highlighted once (re-highlighting 150 lines on every token took ~30 ms), but for those a construct
        still open spans (a docstring), lexed with the runs after it until it closes (app/core/code_runs.py); and
        whether every run reads as in the block highlighted whole."""
        texts, runs, segment, start, exact = _run_texts(code), [], (), FIRST, True
        for k, text in enumerate(texts):
            segment += (text,)
            done = self._highlighted_segment(segment, lang, start, keep=keep_last or k < len(texts) - 1)
            if done.after is not None:
                runs, segment, start, exact = runs + done.runs, (), done.after, exact and done.exact
        return runs + (done.runs if segment else []), exact and not segment

    def _highlighted_segment(self, texts: tuple[str, ...], lang: str, start: LexState, keep: bool) -> Segment:
        key = (texts, lang, start)
        hit = self._runs.get(key)
        if hit is None:
            hit = highlight_segment(texts, self._lexer(lang, texts[0], stripnl=False), self._formatter, start,
                                    settle=keep)
            if not keep:  # the growing last run: each of its versions kept would only fill the cache
                return hit
            self._runs[key] = hit
            while len(self._runs) > STREAM_CACHE:
                self._runs.popitem(last=False)
        self._runs.move_to_end(key)
        return hit

    def _finished_runs(self, code: str, lang: str) -> list[str]:
        """_runs_of(highlight(code)) of a block that streamed: its runs as they streamed where each reads as in the
        block highlighted whole (app/core/code_runs.py tells), without lexing it whole again (a 190-line Python block:
        ~28 ms here, 60-140 ms under load, 4 compare columns ending a frame apart); else the block is lexed whole and
        each run keeps the HTML it streamed in where its tokens are the same, the others formatted again."""
        runs, exact = self._highlighted_runs(code, lang, keep_last=True)
        if exact:
            return [run.html for run in runs]
        lines = split_lines(self._lexer(lang, code).get_tokens(code))
        out = []
        for k, run in enumerate(runs):
            whole = lines[k * STREAM_SEGMENT_LINES:(k + 1) * STREAM_SEGMENT_LINES]
            out.append(run.html if run.lines == whole else
                       format_tokens([token for line in whole for token in line], self._formatter))
        return out

    def _image(self, tokens, idx) -> str:
        """Alt text, never the image: loading it would read whatever file or device the path names."""
        alt = "".join(t.content for t in (tokens[idx].children or []) if t.type in ("text", "code_inline"))
        label = f"image: {alt}" if alt else "image"
        return f'<span style="color:#8b949e">[{html.escape(label)}]</span>'

    def _table_open(self, tokens, idx) -> str:
        # its grid is the table's colour between cells of the answer's: Qt lays out and draws collapsed borders at ~3x
        # and ~5x the cost (a 200-row table: 55-70 ms a layout, 16 ms a paint of its visible part, here)
        return (f'<table border="0" cellspacing="1" cellpadding="5" bgcolor="{RULE_COLOR[self.dark]}" '
                f'style="margin-top:4px; margin-bottom:4px">\n')

    def _cell_open(self, tokens, idx) -> str:
        tokens[idx].attrSet("bgcolor", self._cell)
        return self._md.renderer.renderToken(tokens, idx, self._md.options, {})

    def _quote_open(self, env: dict) -> str:
        env["quotes"] = env.get("quotes", 0) + 1
        if env["quotes"] > MAX_QUOTE_BARS:  # indented only: Qt lays nested tables out in time exponential in depth
            return f'<blockquote style="margin-left:12px; margin-right:0px; color:{QUOTE_TEXT[self.dark]}">\n'
        # QTextDocument draws no CSS border-left: the bar is a narrow coloured cell beside the quote
        return (f'<table width="100%" cellspacing="0" cellpadding="0" style="margin-top:4px; margin-bottom:4px">'
                f'<tr><td width="4" bgcolor="{RULE_COLOR[self.dark]}"></td><td width="10"></td>'
                f'<td style="color:{QUOTE_TEXT[self.dark]}">\n')

    @staticmethod
    def _lexer(lang: str, code: str, **options):
        # No guessing for unlabelled blocks: guess_lexer tries every lexer (tens of ms), and a streaming
        # answer is re-rendered many times a second.
        try:
            return get_lexer_by_name(lang, **options) if lang else TextLexer(**options)
        except ClassNotFound:
            return TextLexer(**options)


def _run_texts(code: str) -> list[str]:
    """A code block's runs of STREAM_SEGMENT_LINES lines, each ending in a newline: as the lexer reads the block whole
    (its outer newlines stripped, a newline at its end)."""
    lines = code.strip("\n").split("\n")
    return ["\n".join(lines[i:i + STREAM_SEGMENT_LINES]) + "\n" for i in range(0, len(lines), STREAM_SEGMENT_LINES)]


def _runs_of(highlighted: str) -> list[str]:
    """Highlighted code cut a run of STREAM_SEGMENT_LINES lines at a time, as a growing block's runs are (Pygments
    closes its spans at the end of each line): an answer that ends keeps the runs it streamed in its document."""
    lines = [line + "\n" for line in highlighted.split("\n")]
    lines[-1] = lines[-1][:-1]
    runs = ["".join(lines[i:i + STREAM_SEGMENT_LINES]) for i in range(0, len(lines), STREAM_SEGMENT_LINES)]
    return [run for run in runs if run] or [""]


def _quote_close(env: dict) -> str:
    env["quotes"] -= 1
    return "</blockquote>\n" if env["quotes"] >= MAX_QUOTE_BARS else "</td></tr></table>\n"


def _verbatim(lines: list[str]) -> str:
    """Lines as typed, without the blank lines around them (QTextDocument honours pre-wrap: spaces kept, long
    lines wrapped)."""
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    if not lines:
        return ""
    body = html.escape("\n".join(lines))
    return f'<p style="white-space:pre-wrap">{body}</p>\n'


def _split_blocks(text: str) -> list[str]:
    """The text cut before each line that starts a top-level block after a blank line, outside fenced code; not before
    a list item (a list with blank lines between its items stays one list)."""
    lines = text.split("\n")
    chunks, start, fence = [], 0, ""
    for i, line in enumerate(lines):
        mark = FENCE.match(line)
        if fence:
            if mark and mark.group(1)[0] == fence[0] and len(mark.group(1)) >= len(fence) and not line[mark.end():].strip():
                fence = ""
        elif mark and not (mark.group(1)[0] == "`" and "`" in line[mark.end():]):  # an info string has no backtick
            fence = mark.group(1)
        elif i > start and not lines[i - 1].strip() and line[:1].strip() and not LIST_ITEM.match(line):
            chunks.append("\n".join(lines[start:i]) + "\n")
            start = i
    chunks.append("\n".join(lines[start:]))
    return chunks


OPEN = "open:"  # the verb of a link of the message's own text


def _link_open(tokens, idx) -> str:
    """A link of the message's own text goes through `open:`, so a model's `[x](regen:)` can never name one of the
    view's own actions (regenerate, edit, copy)."""
    return f'<a href="{OPEN}{html.escape(tokens[idx].attrGet("href") or "", quote=True)}">'


def link_url(href: str) -> str | None:
    """The address of a link of the message's own text; None for the view's own links."""
    return href[len(OPEN):] if href.startswith(OPEN) else None


def openable(url: str) -> bool:
    """Whether a link of a message opens when clicked: web and mail addresses only (a `file:` or custom scheme from a
    model's answer could start a program), mail without fields such as `attach=` (some mail programs attach the file
    it names: a model's link could send ~/.ssh away)."""
    parts = urlsplit(url)
    if parts.scheme.lower() == "mailto":
        return all(key.lower() in MAIL_FIELDS for key, _ in parse_qsl(parts.query, keep_blank_values=True))
    return parts.scheme.lower() in ("http", "https")


def link_tip(href: str) -> str:
    """What hovering a link of a message shows: its address (as a browser does, the text may name another), and why a
    click does nothing where it will not open; nothing for the view's own links."""
    url = link_url(href)
    if url is None:
        return ""
    if openable(url):
        return url
    mail = urlsplit(url).scheme.lower() == "mailto"
    return f"{url} ({'a mail link that attaches files does not open' if mail else 'only web and mail links open'})"


@functools.cache
def _warm_lexers() -> None:
    """Imports the common lexers once, when the window is built, not mid-stream (the first import costs ~50 ms)."""
    for name in COMMON_LANGUAGES:
        get_lexer_by_name(name)


def _math_inline(state, silent: bool) -> bool:
    """`$x$`, `$$x$$`, `\\(x\\)` and `\\[x\\]` inside a line; "$5 and $6" stays money (no space after the opening `$`,
    none before the closing one, no digit right after it)."""
    src, pos = state.src, state.pos
    if src.startswith(("\\(", "\\["), pos):  # LaTeX's delimiters, which many models write instead of dollars
        end = src.find(BRACKETS[src[pos:pos + 2]], pos + 2)
        if end in (-1, pos + 2) or end + 2 > state.posMax:
            return False
        return _push_math(state, silent, src[pos + 2:end], end + 2)
    if src[pos] != "$":
        return False
    delim = "$$" if src.startswith("$$", pos) else "$"
    start = pos + len(delim)
    if start >= state.posMax or src[start].isspace():
        return False
    end = src.find(delim, start)
    while end != -1 and src[end - 1] == "\\":
        end = src.find(delim, end + 1)
    if end == -1 or end == start or end + len(delim) > state.posMax:
        return False
    after = end + len(delim)
    if delim == "$" and (src[end - 1].isspace() or (after < len(src) and src[after].isdigit())):
        return False
    return _push_math(state, silent, src[start:end], after)


def _push_math(state, silent: bool, tex: str, after: int) -> bool:
    if not silent:
        state.push("math_inline", "math", 0).content = tex
    state.pos = after
    return True


def _math_block(state, start_line: int, end_line: int, silent: bool) -> bool:
    """A `$$` … `$$` or `\\[` … `\\]` block, on one line or several, with nothing after its end and no blank line
    inside: `$$a$$ and $$b$$` is two inline formulas, not one block showing "$$ and $$"."""
    if state.sCount[start_line] - state.blkIndent >= 4:
        return False
    first = _line(state, start_line)
    close = BRACKETS.get(first[:2]) if not first.startswith("\\(") else None  # `\\(` opens inline math only
    if close is None:
        return False
    body, line = first[2:], start_line
    while (end := body.find(close)) == -1:
        line += 1
        if line >= end_line or not _line(state, line).strip():
            return False
        body += "\n" + _line(state, line)
    if body[end + 2:].strip():
        return False
    if silent:
        return True
    token = state.push("math_block", "math", 0)
    token.block, token.content, token.map = True, body[:end].strip(), [start_line, line + 1]
    state.line = line + 1
    return True


def _line(state, n: int) -> str:
    return state.src[state.bMarks[n] + state.tShift[n]:state.eMarks[n]]
