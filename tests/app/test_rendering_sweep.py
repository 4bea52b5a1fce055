"""Hostile and unusual message content: rendering never raises, stays inside the bubble and keeps the text."""
from __future__ import annotations

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
