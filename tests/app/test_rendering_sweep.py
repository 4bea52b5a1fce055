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
