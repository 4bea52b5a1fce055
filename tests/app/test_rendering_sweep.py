"""Hostile and unusual message content: rendering never raises, stays inside the bubble and keeps the text."""
from __future__ import annotations

import logging
import re
import time

import pytest

from app.core.markdown_render import MarkdownRenderer
from app.core.tex_text import tex_html


@pytest.mark.parametrize("tex", ["\\frac" * 400, "{" * 600 + "x" + "}" * 600, "^" * 1999, "x^{" * 400 + "}" * 400])
def test_deeply_nested_math_is_shown_as_written(tex):
    """Within the length cap, hundreds of nested groups exhausted Python's stack: the whole answer failed to render."""
    assert tex_html(tex) == tex
    body, _ = MarkdownRenderer().render(f"before ${tex}$ after")
    assert "before" in body and "after" in body


@pytest.mark.parametrize("user", [False, True])
def test_a_long_code_line_wraps_inside_the_message(qapp, user):
    """A 400-character line made the code block as wide as the line: the bubble clipped it and its Copy link."""
    from PySide6.QtGui import QTextDocument

    code = "x = '" + "a" * 400 + "'\n\tindented  twice\n"
    renderer = MarkdownRenderer()
    body, blocks = (renderer.render_typed if user else renderer.render)(f"see:\n```python\n{code}```")
    doc = QTextDocument()
    doc.setHtml(body)
    doc.setTextWidth(600)
    assert doc.idealWidth() <= 600
    assert blocks == [code] and code in doc.toPlainText()  # wrapping changes only the drawing


def _answer(paragraphs: int) -> str:
    para = "Some **bold** text, `code` and a [link](https://example.org/a). " * 6
    parts = [f"## Part {i}\n\n{para}" if i % 10 == 0 else para for i in range(paragraphs)]
    parts.insert(3, "```python\ndef f(x):\n\n    return x\n```")
    parts.insert(5, "1. one\n\n2. two\n   - nested\n\n3. three")
    parts.insert(7, "| a | b |\n|---|---|\n| 1 | 2 |")
    return "\n\n".join(parts)


def test_a_streaming_answer_is_rendered_at_the_cost_of_its_last_block():
    """Each token re-rendered the whole answer: near 50,000 characters every update stalled the window for
    hundreds of ms. Now only the block still growing is parsed again, and the result is the same."""
    from app.core.conversations import Message
    from app.core.message_html import message_html

    text = _answer(120)
    renderer = MarkdownRenderer()
    parsed: list[int] = []
    parse = renderer._md.render
    renderer._md.render = lambda src, env=None: parsed.append(len(src)) or parse(src, env)
    msg = Message(1, 1, None, "assistant", "", "streaming")
    for end in range(0, len(text) + 1, 97):
        msg.content = text[:end]
        parsed.clear()
        streaming = message_html(msg, 1, 1, renderer, busy=False)
    assert sum(parsed) < 1_000, f"{sum(parsed)} characters parsed for one update of a {len(text)}-character answer"
    assert streaming.code_blocks == ["def f(x):\n\n    return x\n"]
    assert renderer.render_streaming(text) == renderer.render(text)  # blocks render apart, to the same HTML


def test_a_long_code_block_is_highlighted_once_the_answer_ends():
    """Highlighting a growing 2,000-line block on every token cost a third of a second each time."""
    from app.core.conversations import Message
    from app.core.message_html import message_html

    code = "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(1000))
    msg = Message(1, 1, None, "assistant", f"Here:\n\n```python\n{code}", "streaming")
    renderer = MarkdownRenderer()
    live = message_html(msg, 1, 1, renderer, busy=False)
    msg.content, msg.state = msg.content + "```\n", "done"
    done = message_html(msg, 1, 1, renderer, busy=False)
    assert live.code_blocks == done.code_blocks == [code]  # Copy copies the same code
    keyword = 'style="color: #007020; font-weight: bold">def</span>'
    assert keyword not in live.html and keyword in done.html
    short = Message(2, 1, None, "assistant", "```python\ndef f():\n    pass\n", "streaming")
    assert keyword in message_html(short, 1, 1, renderer, busy=False).html  # a short one is highlighted as it streams


def test_a_growing_code_block_is_highlighted_a_run_of_lines_at_a_time(monkeypatch):
    """Each token of a streaming code block highlighted all of it again: ~22 ms a token at 100 lines, ~44 ms at 199 on
    a 2-core Xeon, per chat on screen. Finished runs of lines are highlighted once, to the same HTML as the whole."""
    import app.core.markdown_render as md

    lines = [f"    total_{i} = compute(values[{i}])  # step {i}" if i % 7 else "" for i in range(150)]
    text = "Intro\n\n```python\ndef f(values):\n" + "\n".join(lines) + "\n"
    renderer = MarkdownRenderer()
    code = lambda html: "".join(re.findall(r"<pre[^>]*>(.*?)</pre>", html, re.S))  # a table a run while it grows
    assert code(renderer.render_streaming(text)[0]) == code(MarkdownRenderer().render(text)[0])
    highlighted = []
    real, segment = md.highlight, md.highlight_segment
    monkeypatch.setattr(md, "highlight", lambda code, *args: highlighted.append(code.count("\n")) or real(code, *args))
    monkeypatch.setattr(md, "highlight_segment",
                        lambda texts, *args, **kw: highlighted.append("".join(texts).count("\n")) or segment(texts, *args, **kw))
    renderer.render_streaming(text + "    more")
    assert 0 < sum(highlighted) <= md.STREAM_SEGMENT_LINES


DOCSTRING = 'def f(x):\n    """A docstring\n' + "".join(f"    line {i} of it\n" for i in range(14)) + '    """\n'
SPANNING = {  # constructs that span the joins of a growing block's runs of lines
    "python": DOCSTRING + "    s = '''\n" + "".join(f"text {i}\n" for i in range(12)) + "'''\n"
              + "".join(f"    y_{i} = x + {i}  # c\n" for i in range(12))
              # a docstring whose rule, once matched, could match on to a later \"\"\" too: not open for that
              + "".join(f"x_{i} = {i}\n" for i in range(30)) + DOCSTRING,
    "javascript": "function f() {\n  /* a comment\n" + "".join(f"   line {i}\n" for i in range(15)) + "  */\n"
                  + "  const s = `a template\n" + "".join(f"t {i}\n" for i in range(12)) + "`;\n  return 1;\n}\n",
    "c": "int f() {\n  /* a comment\n" + "".join(f"   line {i}\n" for i in range(15)) + "  */\n  return 1;\n}\n",
    # a rule that reads on past the run's end without the sentinel it is lexed with (a definition's name, next line)
    "cpp": "".join(f"int v{i} = {i};\n" for i in range(9)) + "inline std::ostream&\n  Base::dot(std::ostream& o) const\n"
           + "  {\n    return o;\n  }\n",
    # one rule's match across lines, taken only once its end marker comes (the runs before it lexed again then)
    "bash": "set -e\necho start\ncat <<EOF > out.txt\n" + "".join(f"text {i} $HOME\n" for i in range(12)) + "EOF\nls\n",
    "perl": "print <<EOT;\n" + "".join(f"p {i} = 1;\n" for i in range(12)) + "EOT\nprint 1;\n",
    "yaml": "key: value\nblock: |\n" + "".join(f"  line {i}: not a key\n" for i in range(14)) + "other: 1\n",  # a context
}


@pytest.mark.parametrize("lang", list(SPANNING))
def test_a_growing_code_block_is_coloured_across_its_runs_as_the_whole_block(lang):
    """A docstring or a comment that spanned the join of two runs of lines was coloured as code in the next run (and a
    docstring as a plain string in its own) until the answer ended; each step now reads as the block highlighted
    whole, and the finished block too."""
    lines = SPANNING[lang].split("\n")
    renderer = MarkdownRenderer()
    code = lambda html: "".join(re.findall(r"<pre[^>]*>(.*?)</pre>", html, re.S))
    for n in range(1, len(lines) + 1):
        text = f"Intro\n\n```{lang}\n" + "\n".join(lines[:n]) + "\n"
        assert code(renderer.render_streaming(text)[0]) == code(MarkdownRenderer().render(text)[0]), (lang, n)
    text += "```\n"
    assert renderer.render_parts(text) == MarkdownRenderer().render_parts(text)  # the streamed runs kept where the same


def test_a_streaming_answer_renders_only_what_follows_its_settled_blocks(monkeypatch):
    """Each update of a streaming answer split all of its text into blocks again and looked each one up (a
    60,000-character answer: ~1.6 ms a token here, and a chat opened mid-answer paid it on every slice it caught up
    in); the blocks no later text changes are kept, and only those after them are split and rendered. Every step
    still reads as a fresh renderer's, whatever the text (list items that start on a digit, fences, tables)."""
    import random

    import app.core.markdown_render as md

    pieces = ["para text\n", "\n", "- item\n", "1. one\n", "1", ".", " x", "```python\n", "x = 1\n", "```\n",
              "| a | b |\n|---|---|\n", "| 1 | 2 |\n", "> quote\n", "# head\n", "$$\nx^2\n$$\n", "---\n", "  - nested\n"]
    rng, plain = random.Random(3), MarkdownRenderer()
    for _ in range(5):
        text, renderer = "".join(rng.choice(pieces) for _ in range(30)), MarkdownRenderer()
        for n in range(len(text) + 1):
            plain._prefixes.clear()  # it renders the whole text each time, as before
            assert renderer.render_streaming_parts(text[:n]) == plain.render_streaming_parts(text[:n])
    long = "".join(f"## Part {i}\n\nSome words, *a few*.\n\n- a point\n- another\n\n" for i in range(300))
    renderer.render_streaming_parts(long)
    looked, real = [], md.MarkdownRenderer._render_block
    monkeypatch.setattr(md.MarkdownRenderer, "_render_block", lambda self, *a, **k: looked.append(1) or real(self, *a, **k))
    parts, _, complete = renderer.render_streaming_parts(long + "More")
    assert complete and len(parts) > 500 and len(looked) <= 2  # the last block or two, not its 600


MIXED = "".join(["#!/bin/sh\n", "/* comment\n", " more */\n", "def f(x):\n", '    """doc\n', '    """\n',
                 "x = [1, 2, 3]  # c\n", "<div class='a'>\n", "</div>\n", "cat <<EOF\n", "text $HOME\n", "EOF\n",
                 "key: value\n", "  - item\n", '{"a": 1}\n', "SELECT * FROM t;\n", "(defun f (x) x)\n", "end\n", "}\n"] * 3)


@pytest.mark.parametrize("lang", ["csharp", "common-lisp", "foxpro"])
def test_any_lexer_streams_a_block_and_ends_it_as_a_fresh_render(lang, caplog):
    """C#'s lexer keeps its rules on the instance (one set a Unicode level): streaming a C# block raised AttributeError
    on every paint; Common Lisp's has a method of its own that takes no start stack; FoxPro's next run may start a
    token in the blank space the run before ends in. Each streams, and ends as a fresh render (checked on all 600 of
    Pygments' lexers with a mixed sample: none raises or ends otherwise)."""
    renderer = MarkdownRenderer()
    lines = MIXED.splitlines(True)
    with caplog.at_level(logging.WARNING, logger="app.core.code_runs"):
        for n in range(8, len(lines) + 1, 3):
            renderer.render_streaming(f"```{lang}\n" + "".join(lines[:n]))
    assert not caplog.records  # the watch read this lexer: no fallback to runs lexed alone
    text = f"```{lang}\n{MIXED}```\n"
    assert renderer.render_parts(text) == MarkdownRenderer().render_parts(text)


def test_a_pygments_whose_lexer_internals_differ_still_streams_code(monkeypatch, caplog):
    """The streaming highlight reads the state off Pygments' lexing loop (its locals): a Pygments that renamed them made
    every paint of a streaming block raise (as C#'s lexer did for a while). It now falls back to each run lexed alone,
    says so in the log, and the finished block is lexed whole."""
    import app.core.code_runs as runs

    def renamed(lexing):
        raise KeyError("statestack")
    monkeypatch.setattr(runs, "_state", renamed)
    renderer = MarkdownRenderer()
    lines = MIXED.splitlines(True)
    with caplog.at_level(logging.WARNING, logger="app.core.code_runs"):
        for n in range(8, len(lines) + 1, 3):
            html, _ = renderer.render_streaming("```python\n" + "".join(lines[:n]))
            assert "<pre" in html and "doc" in html
    assert any("fell back" in r.getMessage() for r in caplog.records)
    text = f"```python\n{MIXED}```\n"
    assert renderer.render_parts(text) == MarkdownRenderer().render_parts(text)


def test_a_streamed_code_block_ends_without_being_lexed_whole(monkeypatch):
    """The end of an answer lexed its streamed code block whole again to check its runs (a 190-line block: ~30 ms on
    a 2-core Xeon, 60-140 ms under load, 4 compare columns ending a frame apart stalled the window each time); runs that
    read as the whole block's (app/core/code_runs.py tells) are kept as they streamed, and the end reads the same."""
    import app.core.markdown_render as md

    code = "".join(f"    total_{i} = compute(values[{i}], scale={i}.5)  # step {i}\n" for i in range(190))
    text = f"Here is the code:\n\n```python\ndef f(values):\n{DOCSTRING}{code}```\n"
    renderer = MarkdownRenderer()
    for end in range(len(text) - 2_000, len(text), 40):
        renderer.render_streaming(text[:end])
    lexed, real = [], md.MarkdownRenderer._lexer

    def lexer(lang, code, **options):
        made = real(lang, code, **options)
        made.get_tokens = lambda text, *args: lexed.append(text.count("\n")) or type(made).get_tokens(made, text, *args)
        return made
    monkeypatch.setattr(md.MarkdownRenderer, "_lexer", staticmethod(lexer))
    ended = renderer.render_parts(text)
    assert max(lexed, default=0) <= md.STREAM_SEGMENT_LINES  # its last run at most, not its 208 lines
    monkeypatch.undo()
    assert ended == MarkdownRenderer().render_parts(text)


def test_a_long_message_draws_only_what_is_on_screen(parley, qtbot):
    """Every repaint drew all of a 2,000-line answer, most of it off screen: on each token of a streaming one."""
    from PySide6.QtGui import QPainter, QPicture
    from PySide6.QtWidgets import QStyleOptionViewItem

    def drawn(lines: int) -> int:
        conv = parley.service.new_conversation()
        user = parley.store.add_message(conv, None, "user", "code?")
        code = "".join(f"x{i} = {i}\n" for i in range(lines))
        answer = parley.store.add_message(conv, user.id, "assistant", f"```python\n{code}```")
        parley.window.open_chat(conv)
        view = parley.window.chat.view
        height = view.delegate.document(answer)[0].size().height()
        view.model().message_changed(answer.id)  # laid out at its real height, not the estimate
        index = view.model().index(1, 0)
        qtbot.waitUntil(lambda: view.visualRect(index).height() > height
                        and view.visualRect(index).intersects(view.viewport().rect()))
        option = QStyleOptionViewItem()
        option.rect = view.visualRect(index)
        picture = QPicture()  # records what is drawn
        painter = QPainter(picture)
        view.delegate.paint(painter, option, index)
        painter.end()
        return picture.size()

    assert drawn(2000) < 2 * drawn(100)


@pytest.mark.parametrize("text, shown", [
    ("Area \\(\\pi r^2\\), sides \\(a_1 \\le b\\).", "Area π r², sides a₁ ≤ b."),
    ("Hence\n\\[\n\\frac{a+b}{2} \\ge \\sqrt{ab}\n\\]\nas claimed.", "Hence\n(a+b)/2 ≥ √ab\nas claimed."),
    ("On one line: \\[x^2\\] and \\(y\\).", "On one line: x² and y."),
    ("Kept: \\\\(not math\\\\) and \\( unclosed", "Kept: \\(not math\\) and ( unclosed"),
])
def test_latex_bracket_delimiters_are_math(qapp, text, shown):
    """Models write `\\(…\\)` and `\\[…\\]` as often as dollars: they were shown as bare TeX ("(\\pi r^2)")."""
    from PySide6.QtGui import QTextDocument

    doc = QTextDocument()
    doc.setHtml(MarkdownRenderer().render(text)[0])
    assert doc.toPlainText().strip() == shown


@pytest.mark.parametrize("text, shown", [
    ("$$a^2$$ and $$b^2$$", "a² and b²"),
    ("$$x$$ is here\nand\n\nnot $$", "x is here\nand\nnot $$"),
    ("$$\n\\frac{a}{b}\n$$\nafter", "a/b\nafter"),
])
def test_a_display_formula_ends_at_its_closing_dollars(qapp, text, shown):
    """A line opening with `$$` ran to the next line ending in `$$`: "$$a^2$$ and $$b^2$$" showed "a²$$ and $$b²"."""
    from PySide6.QtGui import QTextDocument

    doc = QTextDocument()
    doc.setHtml(MarkdownRenderer().render(text)[0])
    assert doc.toPlainText().strip() == shown


@pytest.mark.parametrize("text", ["Close it with `</think>` and go on.", "```\n</think>\n```\nThat tag ends a thought."])
def test_an_answer_quoting_the_closing_tag_is_all_reply(text):
    """A bare `</think>` ends an R1 distill's thought; quoted in an answer it hid the text before it as a "thought",
    and Copy and the next turn's history lost it."""
    from app.core.reasoning import reply_text, split_reasoning

    assert split_reasoning(text).thought is None and reply_text(text) == text
    assert split_reasoning("Let me think.\n</think>\n\nFour.").reply == "Four."  # the distill's own form still splits


def test_an_empty_thought_shows_no_thought_line():
    """Qwen3 told /no_think (and R1 on a greeting) writes an empty `<think></think>`: it showed "Thought for 0 words"
    with a Show link that showed nothing."""
    from app.core.conversations import Message
    from app.core.message_html import message_html

    renderer = MarkdownRenderer()
    done = message_html(Message(1, 1, None, "assistant", "<think>\n\n</think>\n\nFour.", "done"), 1, 1, renderer, False)
    assert "Thought for" not in done.html and "think:" not in done.html and "Four." in done.html
    live = message_html(Message(1, 1, None, "assistant", "<think>\n", "streaming"), 1, 1, renderer, False)
    assert "Thinking…" in live.html  # a thought that has only begun still says so


@pytest.mark.parametrize("thought, words", [("用户问的是二加二。", 8), ("Two plus two, 二加二 is 四.", 8), ("one — two\nthree", 3)])
def test_a_chinese_thought_counts_its_words(thought, words):
    """Qwen3 thinks in Chinese for a Chinese prompt: a long thought without spaces said "Thought for 1 word"."""
    from app.core.conversations import Message
    from app.core.message_html import message_html

    msg = Message(1, 1, None, "assistant", f"<think>{thought}</think>答案是四", "done")
    assert f"Thought for {words} words" in message_html(msg, 1, 1, MarkdownRenderer(), False).html


def test_an_answer_of_more_blocks_than_the_cache_holds_still_streams_cheaply():
    """With more finished blocks than the cache kept, each update evicted the very blocks the next one needed."""
    from app.core.markdown_render import STREAM_CACHE

    text = "".join(f"Point {i} is *short*.\n\n" for i in range(STREAM_CACHE + 200))
    renderer = MarkdownRenderer()
    parsed: list[int] = []
    parse = renderer._md.render
    renderer._md.render = lambda src, env=None: parsed.append(len(src)) or parse(src, env)
    renderer.render_streaming(text)
    parsed.clear()
    renderer.render_streaming(text + "And")
    assert sum(parsed) < 100
    others = ["".join(f"Chat {c}, point {i}.\n\n" for i in range(400)) for c in range(4)]  # four chats stream at once
    for other in others:
        renderer.render_streaming(other)
    parsed.clear()
    for other in others:
        renderer.render_streaming(other + "And")
    assert sum(parsed) < 100


def test_resizing_the_window_lays_messages_out_again_without_rendering_them(parley, qtbot):
    """Each step of a window resize rendered every message on screen from its Markdown again (a long answer: a stall
    per step of the drag); only the layout depends on the width."""
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "long?")
    answer = store.add_message(conv, user.id, "assistant", "A **long** answer. " * 400)
    w.open_chat(conv)
    view = w.chat.view
    qtbot.wait(20)
    doc, _ = view.delegate.document(answer)
    renders, tall = view.delegate.renders, doc.size().height()
    w.resize(w.width() - 250, w.height())
    qtbot.waitUntil(lambda: view.delegate.document(answer)[0].textWidth() == view.delegate.text_width())
    view.viewport().repaint()
    assert view.delegate.renders == renders and view.delegate.document(answer)[0] is doc
    assert doc.size().height() > tall  # narrower: laid out again, taller


def test_a_long_answer_is_laid_out_again_once_a_resize_settles(parley, qtbot):
    """Each step of a drag laid all of a long answer out again at the new width (60,000 characters: 100-400 ms a
    step while the window was being resized); it keeps its width until the resize settles, then reflows once."""
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "long?")
    answer = store.add_message(conv, user.id, "assistant", "A **long** answer. " * 2000)
    w.open_chat(conv)
    view = w.chat.view
    qtbot.wait(300)  # the window's first resize settles
    doc, _ = view.delegate.document(answer)
    laid_out = doc.textWidth()
    w.resize(w.width() - 250, w.height())
    view.viewport().repaint()
    assert view.delegate.document(answer)[0].textWidth() == laid_out  # mid-drag: not laid out again
    qtbot.waitUntil(lambda: view.delegate.document(answer)[0].textWidth() == view.delegate.text_width() < laid_out)
    assert view.delegate.document(answer)[0] is doc


@pytest.mark.parametrize("tex, shown", [
    ("x = \\boxed{42}", "x = <b>42</b>"),  # how reasoning models mark their final answer
    ("\\binom{n}{k}", "C(n, k)"),
    ("\\sqrt[3]{8} = 2", "³√8 = 2"),
    ("a \\equiv b \\pmod{n}", "a ≡ b  (mod n)"),
    ("A^\\top", "A<sup>⊤</sup>"),
    ("\\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix}", "( a   b <br> c   d )"),
    ("\\begin{aligned} x &= 1 \\end{aligned}", " x  = 1 "),
])
def test_common_tex_commands_are_laid_out(tex, shown):
    """`\\boxed{42}` read "boxed42", a matrix "beginpmatrix a &amp; b …", `\\binom{n}{k}` "binomnk"."""
    assert tex_html(tex) == shown


def test_a_mail_link_that_attaches_a_file_does_not_open(parley, monkeypatch):
    """Some mail programs attach the file a mailto: link's `attach=` names: a model's link could mail ~/.ssh away."""
    from PySide6.QtGui import QDesktopServices

    from app.core.markdown_render import link_tip

    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "mail?")
    answer = store.add_message(conv, user.id, "assistant", "[mail](mailto:a@b.org?attach=/home/u/.ssh/id_rsa) "
                                                           "[write](mailto:a@b.org?subject=Hi&body=there)")
    w.open_chat(conv)
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toString()))
    for href in ("open:mailto:a@b.org?attach=/home/u/.ssh/id_rsa", "open:MAILTO:a@b.org?Attachment=x",
                 "open:mailto:a@b.org?subject=Hi&body=there"):
        w.chat.view.activate(answer, href)
    assert opened == ["mailto:a@b.org?subject=Hi&body=there"]
    assert link_tip("open:mailto:a@b.org?attach=x").endswith("(a mail link that attaches files does not open)")


def test_deeply_nested_quotes_lay_out_at_once(qapp):
    """Each quote level was a table in a table: Qt lays those out in time exponential in their depth, and 20 levels
    (markdown-it's limit) of `> > > …` froze the window for a minute."""
    from PySide6.QtGui import QTextDocument

    def depth(frame) -> int:
        return 1 + max((depth(child) for child in frame.childFrames()), default=0)

    text = "".join("> " * level + f"level {level}\n" for level in range(1, 20))  # markdown-it drops a 20th
    doc = QTextDocument()
    doc.setHtml(MarkdownRenderer().render(text)[0])
    doc.setTextWidth(600)
    assert depth(doc.rootFrame()) <= 6
    assert all(f"level {level}" in doc.toPlainText() for level in range(1, 20))


def _contrast(a: str, b: str) -> float:
    """WCAG's contrast ratio of two #rrggbb colours."""
    def luminance(c: str) -> float:
        rgb = [int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        r, g, b = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in rgb]
        return 0.2126 * r + 0.7152 * g + 0.0722 * b
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
@pytest.mark.parametrize("state, error, stats", [("error", "boom", None), ("queued", "", None), ("stopped", "", None),
                                                 ("done", "", {"reason": "length"}), ("done", "a warning", None)])
def test_a_message_s_note_is_readable_on_its_theme(dark, state, error, stats):
    """A message's error, queued and cut-short notes at WCAG AA (4.5:1) against the theme's message background: the
    error's #d33 was 3.7:1 on dark, the queued note's #b58900 3.2:1 and the grey notes' #888 3.5:1 on white."""
    import re

    from app.core.conversations import Message
    from app.core.message_html import message_html
    from app.qt.theme import _COLORS

    msg = Message(1, 1, None, "assistant", "Some text.", state=state, error=error, stats=stats)
    shown = message_html(msg, 1, 1, MarkdownRenderer(dark=dark), busy=False).html
    colours = [c if len(c) == 7 else "#" + "".join(x * 2 for x in c[1:])
               for c in re.findall(r'<p style="color:(#[0-9a-f]{6}|#[0-9a-f]{3})"', shown)]
    assert colours
    assert all(_contrast(c, _COLORS[dark]["base"]) >= 4.5 for c in colours), colours


FINISH_BLOCKS = {"p": "A paragraph with *emphasis*.\n", "h2": "## Heading\n", "setext": "Title\n===\n",
                 "ul": "- a\n- b\n", "loose": "- a\n\n- b\n", "ol": "3. three\n4. four\n", "code": "```python\nx = 1\n```\n",
                 "tilde": "~~~\ny\n~~~\n", "open fence": "```\nnever closed\n", "indented": "    code\n",
                 "table": "| a | b |\n|---|---:|\n| 1 | 2 |\n", "quote": "> quoted\nlazy\n", "hr": "---\n",
                 "math": "$$\nx^2\n$$\n", "html": "<b>raw</b>\n", "ref": "[x]: https://example.org\n",
                 "uses ref": "See [x] and [y][x].\n", "item text": "  indented text\n"}


def test_a_finished_answer_renders_block_by_block_to_the_same_html():
    """The blocks of a finished answer render apart (those it streamed are reused) and join to render()'s very HTML,
    whatever two blocks meet and however far apart; a reference link makes it one part, rendered whole."""
    import itertools

    renderer = MarkdownRenderer()
    for (a, first), (b, second), gap in itertools.product(FINISH_BLOCKS.items(), FINISH_BLOCKS.items(), ["", "\n"]):
        text = f"Intro.\n\n{first}{gap}{second}\nEnd."
        parts, blocks = renderer.render_parts(text)
        assert ("".join(parts), blocks) == renderer.render(text), (a, b, gap)
    parts, _ = renderer.render_parts("See [x].\n\nMore.\n\n[x]: https://example.org\n")
    assert len(parts) == 1 and 'href="open:https://example.org"' in parts[0]


def test_a_streamed_answer_is_not_rendered_again_when_it_ends():
    """When a 60,000-character answer ended, all of it was rendered again (~250 ms of Markdown and highlighting on
    this 2-core Xeon, on top of the document); now only its last block is, and the closed blocks it streamed are
    those of the finished answer."""
    from app.core.conversations import Message
    from app.core.message_html import message_html

    text = _answer(120)
    renderer = MarkdownRenderer()
    streamed = message_html(Message(1, 1, None, "assistant", text, "streaming"), 1, 1, renderer, busy=True)
    parsed: list[int] = []
    parse = renderer._md.render
    renderer._md.render = lambda src, env=None: parsed.append(len(src)) or parse(src, env)
    done = message_html(Message(1, 1, None, "assistant", text, "done"), 1, 1, renderer, busy=False)
    assert sum(parsed) < 1_000, f"{sum(parsed)} characters parsed again when a {len(text)}-character answer ended"
    assert done.html.endswith(MarkdownRenderer().render(text)[0]) and done.parts[2:-1] == streamed.parts[2:-1]


def test_a_streaming_answer_past_its_deadline_renders_a_share_of_new_blocks_a_call():
    """A chat opened mid-answer rendered all of its Markdown at once (~250 ms at 60,000 characters here); past the
    deadline each call renders CATCH_UP_CHARS of blocks it had not rendered before (one block at least), and the blocks
    so far are its first parts."""
    import time

    import app.core.markdown_render as md

    text = _answer(120)
    renderer = MarkdownRenderer()
    calls = []
    while not calls or not calls[-1][2]:
        calls.append(renderer.render_streaming_parts(text, deadline=time.perf_counter() - 1))
    counts = [len(parts) for parts, _, _ in calls]
    assert 1 < len(counts) <= len(text) // md.CATCH_UP_CHARS + 1 and counts == sorted(set(counts))  # new blocks a call
    assert calls[-1][:2] == MarkdownRenderer().render_streaming_parts(text)[:2]


def test_an_answer_catching_up_past_its_deadline_renders_a_share_of_it_each_call():
    """Under load the view's 10 ms deadline was spent before the first new block of a chat opened mid-answer, and each
    turn of the event loop rendered one block: a 22,000-character answer of 750 short blocks took 750 turns (~40 s on
    a busy 2-core Xeon; tests/app/test_stream_document timed out waiting for it). Each call now renders CATCH_UP_CHARS
    of new blocks at least."""
    import app.core.markdown_render as md

    section = "## Part\n\nSome words in a paragraph.\n\n```python\nx = 1\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
    text, renderer, calls = section * 250, MarkdownRenderer(), 1
    while not renderer.render_streaming_parts(text, deadline=0.0)[2] and calls < 1_000:
        calls += 1
    assert calls <= len(text) // md.CATCH_UP_CHARS + 1
    assert renderer.render_streaming_parts(text)[0] == MarkdownRenderer().render_streaming_parts(text)[0]


def _table_drawn(html: str, clip_top: float = 0) -> tuple:
    """(thread CPU seconds, image) of laying `html` out and drawing 600 px of it from `clip_top`, as the chat view
    draws a message."""
    from PySide6.QtCore import QRectF
    from PySide6.QtGui import QAbstractTextDocumentLayout, QImage, QPainter

    from app.qt.stream_document import SafeDocument

    doc = SafeDocument()
    doc.setTextWidth(600)
    doc.setHtml(html)
    image = QImage(600, 600, QImage.Format.Format_ARGB32)
    image.fill(0xFF000000)
    painter = QPainter(image)
    painter.translate(0, -clip_top)
    ctx = QAbstractTextDocumentLayout.PaintContext()
    ctx.clip = QRectF(0, clip_top, 600, 600)
    start = time.thread_time()
    doc.documentLayout().draw(painter, ctx)
    spent = time.thread_time() - start
    painter.end()
    return spent, image


@pytest.mark.parametrize("dark", [False, True])
def test_a_table_draws_its_grid_between_cells_of_the_answer_s_colour(qapp, dark):
    """A table's borders were collapsed borders, which Qt lays out and draws at ~3x and ~5x the cost of a table's own
    (a 200-row table: 55-70 ms a layout, each token of a growing one, and 16 ms a paint of its visible part): its grid
    is now the table's colour between cells of the colour the answer is drawn on, one pixel as before."""
    from PySide6.QtGui import QColor

    from app.core.markdown_render import RULE_COLOR

    html = MarkdownRenderer(dark=dark, background="#123456").render("| wide cell |\n|---|\n| x |\n")[0]
    _, image = _table_drawn(html)
    row = [image.pixelColor(x, 12).name() for x in range(0, 40)]  # across the table's left edge, in its first cell
    rule, cell = QColor(RULE_COLOR[dark]).name(), "#123456"
    assert rule in row and cell in row and row.index(cell) == row.index(rule) + 1 and row.count(rule) == 1

    rows = "".join(f"| Country {i} | City {i} | {i * 12345:,} |\n" for i in range(200))
    html = MarkdownRenderer(dark=dark).render("| Country | Capital | Population |\n|---|---|---:|\n" + rows)[0]
    collapsed = re.sub(r"<table[^>]*>", '<table border="1" cellspacing="0" cellpadding="5" style="border-collapse:'
                       f'collapse; border-style:solid; border-color:{RULE_COLOR[dark]}">', html, count=1)
    ours, theirs = [], []
    for _ in range(5):  # interleaved: the machine's load falls on both
        ours.append(_table_drawn(html, 3_000)[0])
        theirs.append(_table_drawn(collapsed, 3_000)[0])
    assert min(ours) < 0.6 * min(theirs), (min(ours), min(theirs))  # 0.40-0.43 here; collapsed borders both ~1.0
