"""A growing table or list is rendered a row or an item at a time, and reads as markdown-it's render of it whole."""
from __future__ import annotations

import random

from app.core.markdown_render import RUN_SEAM, MarkdownRenderer

CELLS = [" x ", " **b** ", " `c|d` ", " \\| ", "", " $x$ ", " [l](http://a) ", " 12.5 "]
ITEMS = ["item", "**b** x", "a\n  b", "a\n\n  para", "x\n  - nested\n  - n2", "y\n\n  - nested", "`c`", "lazy\ncont",
         "q\n  > quote", "t\n\n", "", "z\n---", "h\n# head", "[x]", "    indented", "a\n\n\n"]
HEADS = ["", "", "Steps:\n\n", "## Head\n\n", "> q\n\n", " - x\n\n", "para\n", "    code\n\n", "| a |\n|---|\n\n"]
TAILS = ["", "|", "- ", "1. ", "\n", "\n\n", "# h", "> q", "text", "  - n", "---", "* * *"]


def _table(rng: random.Random) -> str:
    n = rng.randint(1, 4)
    head = "|" + "|".join(f" h{i} " for i in range(n)) + "|\n|" + "|".join(
        rng.choice(["---", ":--", "--:", ":-:"]) for _ in range(n)) + "|\n"
    rows = "".join("|" + "|".join(rng.choice(CELLS) for _ in range(rng.randint(0, n + 1))) + rng.choice(["|", ""]) + "\n"
                   for _ in range(rng.randint(0, 6)))
    return head + rows + rng.choice(TAILS)


def _list(rng: random.Random) -> str:
    mark, out = rng.choice(["- ", "* ", "+ ", "1. ", "1) "]), []
    for i in range(rng.randint(1, 6)):
        number = f"{rng.choice([i + 1, i + 3, 1])}{mark[1:]}" if mark[0].isdigit() else mark
        out.append(number + rng.choice(ITEMS) + "\n" + ("\n" if rng.random() < 0.2 else ""))
    return rng.choice(HEADS) + "".join(out) + rng.choice(TAILS)


def test_every_step_of_growing_tables_and_lists_renders_as_markdown_it_whole():
    renderer, rng, joined = MarkdownRenderer(), random.Random(7), 0
    for case in range(90):
        text = _table(rng) if case % 2 else _list(rng)
        for k in range(1, len(text) + 1):
            env = {"code_blocks": [], "streaming": True, "growing": True, "runs": True}
            got = renderer._growing.render(text[:k], dict(env))
            if got is not None:
                joined += 1
                assert got == renderer._md.render(text[:k], dict(env)), text[:k]
    assert joined > 800  # most steps take the row/item path


def _countries(rows: int) -> str:
    rng = random.Random(1)
    body = "".join(f"| Country {i} | City {rng.randint(1, 999)} | {rng.randint(1, 10 ** 8):,} | *{rng.choice('ABC')}* |\n"
                   for i in range(rows))
    return f"Here are the countries:\n\n| Country | Capital | Population | Region |\n|:---|---|---:|:-:|\n{body}\nThat is all."


def _steps(items: int) -> str:
    body = "".join(f"{i + 1}. Step **{i}**: run `make {i}` and check the output\n"
                   + ("   - a nested note\n" if i % 7 == 3 else "") + ("\n" if i == items // 2 else "")
                   for i in range(items))
    return f"## Steps\n\nDo this:\n\n{body}\n- a bullet list after\n- with two items\n"


def test_a_streamed_table_and_list_read_as_a_fresh_render_at_every_step():
    """Column alignments, list numbering and looseness (a blank line between two items, half-way, changes the whole list)
    as the whole text rendered anew, char by char."""
    fresh = MarkdownRenderer()  # render() keeps nothing between calls
    for text in (_countries(20), _steps(24)):
        streamed = MarkdownRenderer()
        for k in range(1, len(text) + 1, 4):
            assert streamed.render_streaming(text[:k]) == fresh.render(text[:k]), text[:k]
        assert "".join(streamed.render_parts(text)[0]) == fresh.render(text)[0]


def _parsed_per_update(text: str, tail: int) -> list[int]:
    """Characters markdown-it parsed on each update of the last `tail` characters of `text` streaming."""
    renderer = MarkdownRenderer()
    renderer.render_streaming(text[:-tail])
    parse, seen = renderer._md.parse, []
    renderer._md.parse = lambda src, env=None: (seen.append(len(src)), parse(src, env))[1]
    counts = []
    for k in range(tail - 1, -1, -3):
        seen.clear()
        renderer.render_streaming(text[:len(text) - k])
        counts.append(sum(seen))
    return counts


def test_an_update_of_a_long_table_or_list_parses_its_new_rows_not_all_of_it():
    """Each token at the end of a 300-row table parsed all of it again (~19,000 characters), of a 300-item list too
    (~16,000): now the new row or item."""
    table = _countries(300)[:-len("\nThat is all.")]
    items = "".join(f"{i + 1}. Item **{i}** with some words about it\n" for i in range(300))
    for text in (table, "Steps:\n\n" + items):
        assert len(text) > 12_000
        assert max(_parsed_per_update(text, 200)) < 1_000


def _noted(items: int) -> str:
    """A numbered list with a note under every 10th item, indented three spaces as models write it: from item 10 on
    that is no longer nested (the number takes four), so the notes cut the list into lists of one kind after another."""
    return "Steps:\n\n" + "".join(f"{i + 1}. Step **{i}**: run `make {i}`\n" + ("   - a note\n" if i % 10 == 9 else "")
                                  for i in range(items))


def test_lists_of_one_kind_after_another_stream_an_item_at_a_time():
    """Each token at the end of such a list (the bench's list answer) rendered all of it again (~16,000 characters at
    300 items, 22-25 ms here): lists one after another are each joined from their items."""
    fresh, streamed, text = MarkdownRenderer(), MarkdownRenderer(), _noted(24)
    for k in range(1, len(text) + 1, 4):
        assert streamed.render_streaming(text[:k]) == fresh.render(text[:k]), text[:k]
    assert "".join(streamed.render_parts(text)[0]) == fresh.render(text)[0]
    assert fresh.render(text)[0].count("<ol") == 3
    assert max(_parsed_per_update(_noted(300), 200)) < 1_000


def test_a_list_right_after_a_line_of_text_streams_an_item_at_a_time():
    """"Steps:" and a list on the next line (no blank line between) rendered all of it again on every token (~13,000
    characters parsed a token at 300 items): a list that can end the paragraph before it (a bullet, or the number 1)
    is joined from its items too; one that cannot ("3.") is that paragraph's text, rendered whole as before."""
    items = "".join(f"{i + 1}. Item **{i}** with some words about it\n" for i in range(300))
    assert max(_parsed_per_update("Steps:\n" + items, 200)) < 1_000
    fresh = MarkdownRenderer()
    for text in ("Steps:\n" + items[:900], "## Steps\n- a\n- b\n  - c\n- d\n", "Steps:\n3. a\n4. b\n"):
        streamed = MarkdownRenderer()
        for k in range(1, len(text) + 1, 5):
            assert streamed.render_streaming(text[:k]) == fresh.render(text[:k]), text[:k]


def test_a_table_right_after_a_line_of_text_streams_a_row_at_a_time():
    """"Here is the table:" and the table on the next line (no blank line between: one block) rendered all of it again
    on every token (~19,000 characters parsed a token at 300 rows) and put it into the document whole. The text before
    it renders once and the table a row at a time, cut apart where the document takes them; in a quote or a list item
    the table's lines are that text's, rendered whole as before."""
    table = _countries(300)[:-len("\nThat is all.")].replace(":\n\n", ":\n", 1)
    assert max(_parsed_per_update(table, 200)) < 1_000
    heads = ["Here is the table:\n", "## Head\n", "> q\n", "- x\n", "para\nmore\n", "Title\n===\n", "Steps:\n1. a\n"]
    renderer, rng = MarkdownRenderer(), random.Random(5)
    for case in range(35):
        text = heads[case % len(heads)] + _table(rng)
        for k in range(1, len(text) + 1):
            env = {"code_blocks": [], "streaming": True, "growing": True, "runs": True}
            got = renderer._growing.render(text[:k], dict(env))
            assert got is None or got.replace(RUN_SEAM, "") == renderer._md.render(text[:k], dict(env)), text[:k]
    fresh = MarkdownRenderer()
    for text in (_countries(20).replace(":\n\n", ":\n", 1), "> q\n| a |\n|---|\n| 1 |\n"):
        streamed = MarkdownRenderer()
        for k in range(1, len(text) + 1, 3):
            assert streamed.render_streaming(text[:k]) == fresh.render(text[:k]), text[:k]
        assert "".join(streamed.render_parts(text)[0]) == fresh.render(text)[0]


def test_a_long_growing_table_renders_in_chunks_that_join_into_it_whole():
    """A growing table over CHUNK_ROWS rows renders as tables of CHUNK_ROWS rows (the view's document lays out only the
    last again on each token), which join into markdown-it's render of the table at every step, across a new chunk's
    first row; complete, it renders whole."""
    from app.core.growing_block import CHUNK_ROWS, chunk_run, chunk_tables, join_chunks

    streamed, fresh = MarkdownRenderer(), MarkdownRenderer()
    text = _countries(2 * CHUNK_ROWS + 5)[:-len("\nThat is all.")]
    for k in range(len(text) - 400, len(text) + 1, 7):
        parts = streamed.render_streaming_parts(text[:k])[0]
        run = chunk_run(parts)
        assert run == 2 + (text[:k].count("\n|") > 2 + 2 * CHUNK_ROWS), text[:k]  # the header and delimiter lines
        assert "".join(parts[:-run]) + join_chunks(chunk_tables(parts[-run:])) == fresh.render(text[:k])[0], text[:k]
    assert "".join(streamed.render_parts(text)[0]) == fresh.render(text)[0]
    assert chunk_run(streamed.render_parts(text)[0]) == 0


def test_a_token_at_the_end_of_a_long_table_looks_up_its_last_rows_only():
    """Each token looked every row of the table up in the rendered rows again (~0.2 ms a token at 400 rows here, ~0.55
    at 1,000): the rows before the last, as last rendered, are kept in order per table."""
    renderer = MarkdownRenderer()
    text = _countries(300)[:-len("\nThat is all.")]
    renderer.render_streaming(text[:-200])
    cached, looked = renderer._growing._cached, []
    renderer._growing._cached = lambda cache, key, make: (looked.append(key), cached(cache, key, make))[1]
    for k in range(199, -1, -7):
        looked.clear()
        assert renderer.render_streaming(text[:len(text) - k])[0].count("<tr>") == text[:len(text) - k].count("\n|") - 1
        assert len(looked) <= 3, len(looked)  # the head, a row finished since and the last
