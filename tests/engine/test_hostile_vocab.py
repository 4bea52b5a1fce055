"""Hostile tokenizer metadata and chat templates in a GGUF (issue 23, stop 78's mutation sweep): a tokenizer that
cannot be built is one clear line at load; a template that loops, nests or grows without end fails its turn quickly,
without allocating gigabytes."""
from __future__ import annotations

import time

import gguf
import pytest

from engine.errors import ParleyError, TemplateError, TokenizerError
from engine.tokenizer.chat_template import ChatTemplate
from tests.engine.test_hostile_gguf import Layout, load_bounded, read_layout

V = gguf.GGUFValueType


@pytest.fixture(scope="module")
def llama(tiny_models) -> Layout:
    return read_layout(tiny_models["llama"].gguf_path)


def _merges(layout: Layout) -> list[str]:
    return list(layout.kv["tokenizer.ggml.merges"][1])


@pytest.mark.parametrize("change", ["unknown pieces", "three pieces", "only spaces", "empty tokens"])
def test_a_bpe_vocabulary_its_merges_do_not_fit_is_one_clear_line(llama, tmp_path, change):
    """tokenizers' bare Exception ('Error while initializing BPE: Token `zzq` out of vocabulary') reached the user
    as 'Could not load m.gguf: Exception(...)'."""
    n = len(_merges(llama))
    if change == "unknown pieces":
        bad = llama.set("tokenizer.ggml.merges", V.ARRAY, ["zzq qqz"] * n, V.STRING)
    elif change == "three pieces":
        bad = llama.set("tokenizer.ggml.merges", V.ARRAY, [m + " x" for m in _merges(llama)], V.STRING)
    elif change == "only spaces":
        bad = llama.set("tokenizer.ggml.merges", V.ARRAY, ["   "] * n, V.STRING)
    else:
        tokens = llama.kv["tokenizer.ggml.tokens"][1]
        bad = llama.set("tokenizer.ggml.tokens", V.ARRAY, [""] * len(tokens), V.STRING)
    result = load_bounded(bad.write(tmp_path / "m.gguf"))
    assert isinstance(result, TokenizerError) and "cannot be built" in str(result), repr(result)


# Templates the sandbox let through before: nested loops over a string had no operator or range() to check (ran
# for hours); the others grew gigabytes in one filter, method or captured block (indent: 5 GB in 30 s and rising).
UNBOUNDED_TEMPLATES = {
    "loops over a string": "{% set s = 'a' * 1000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "indent": "{% set s = 'a\\n' * 500000 %}{{ s|indent(1000000) }}",
    "indent by a string": "{% set s = 'a\\n' * 500000 %}{{ s|indent('x' * 1000000) }}",
    "tojson indent": "{% set ns = namespace(x=1) %}{% for i in range(900) %}{% set ns.x = [ns.x] %}{% endfor %}"
                     "{{ ns.x|tojson(indent=1000000) }}",
    "join": "{{ range(100000)|join('x' * 1000000) }}",
    "str.join": "{{ ('x' * 1000000).join(range(100000)|map('string')) }}",
    "str.replace": "{{ ('a' * 1000000).replace('a', 'b' * 1000000) }}",
    "str.format": "{{ ('{0}' * 300000).format('x' * 1000000) }}",
    "str.translate": "{{ ('a' * 1000000).translate({97: 'b' * 1000000}) }}",
    "% of a tuple": "{{ ('%s' * 500000) % ((('x' * 1000000),) * 500000) }}",
    "a set block": "{% set s = 'x' * 1000000 %}{% set b %}{% for i in range(1000) %}{{ s ~ s }}{% endfor %}"
                   "{% endset %}",
    "a macro": "{% set s = 'x' * 1000000 %}{% macro m() %}{% for i in range(100000) %}{{ s }}{% endfor %}"
               "{% endmacro %}{% set y = m() %}",
    "a filter block": "{% set s = 'x' * 1000000 %}{% filter upper %}{% for i in range(100000) %}{{ s }}{% endfor %}"
                      "{% endfilter %}",
}
# a list of one long string 10**5 times is 800 KB of references and 100 GB as text
LIST_AS_TEXT = {
    "output": "{% set s = 'x' * 1000000 %}{{ [s] * 100000 }}",
    "nested output": "{% set s = 'x' * 1000000 %}{% set a = [s] %}{{ [a] * 100000 }}",
    "~": "{% set s = 'x' * 1000000 %}{% set t = ([s] * 100000) ~ '' %}",
    "string filter": "{% set s = 'x' * 1000000 %}{{ ([s] * 100000)|string|length }}",
    "join filter": "{% set s = 'x' * 1000000 %}{{ ([s] * 100000)|join }}",
    "format": "{% set s = 'x' * 1000000 %}{{ '{}'.format([s] * 100000)|length }}",
    "%": "{% set s = 'x' * 1000000 %}{{ ('%s' % ([s] * 100000,))|length }}",
}
UNBOUNDED_TEMPLATES |= {f"a long list as text by {k}": v for k, v in LIST_AS_TEXT.items()}


@pytest.mark.parametrize("template", list(UNBOUNDED_TEMPLATES.values()), ids=list(UNBOUNDED_TEMPLATES))
def test_templates_that_loop_or_grow_without_bound_are_stopped_by_the_budget(template):
    start = time.monotonic()
    with pytest.raises(TemplateError) as caught:
        ChatTemplate(template).render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 2.0
    assert "MemoryError" not in str(caught.value)  # the budget refused it, not the allocator


@pytest.mark.parametrize("template, text", [
    ("{% set b %}{% for m in messages %}{{ m.content|upper }}{% endfor %}{% endset %}{{ b|indent(2) }}", "HI"),
    ("{{ messages|map(attribute='content')|join(', ') }}{{ ', '.join(['a', 'b']) }}", "hia, b"),
    ("{{ messages[0].content.replace('h', 'H') }} {{ '{} {}'.format(1, 2) }} {{ '%s!' % 'x' }}", "Hi 1 2 x!"),
    ("{{ messages|tojson(indent=2) }}", '"content": "hi"'),
    ("{% macro m(x) %}[{{ x }}]{% endmacro %}{% for c in 'ab' %}{{ m(c) }}{% endfor %}", "[a][b]"),
])
def test_ordinary_templates_still_render(template, text):
    assert text in ChatTemplate(template).render([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("name", ["n" * (1 << 20), "\x1b]0;pwned\x07model", ""])
def test_a_general_name_that_cannot_be_shown_gives_way_to_the_files_name(llama, tmp_path, name):
    """A 1 MB general.name was the model's name in the app's list and status line, and in the CLI's --json."""
    lm = load_bounded(llama.set("general.name", V.STRING, name).write(tmp_path / "tiny-model.gguf"))
    assert lm.name == "tiny-model"


def test_a_sensible_general_name_is_kept(llama, tmp_path):
    lm = load_bounded(llama.set("general.name", V.STRING, "Tiny Llama 3.2").write(tmp_path / "m.gguf"))
    assert lm.name == "Tiny Llama 3.2"


def test_more_tokens_than_the_embedding_has_rows_is_refused_at_load(llama, tmp_path):
    """It loaded, and a prompt holding one of the extra tokens failed with 'Generation failed: IndexError('index out
    of range in self')'."""
    extra = [f"zzz{i}" for i in range(10)]
    tokens, types = llama.kv["tokenizer.ggml.tokens"][1], llama.kv["tokenizer.ggml.token_type"][1]
    bad = (llama.set("tokenizer.ggml.tokens", V.ARRAY, [*tokens, *extra], V.STRING)
           .set("tokenizer.ggml.token_type", V.ARRAY, [*types, *[4] * len(extra)], V.INT32))
    result = load_bounded(bad.write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and f"{len(tokens) + 10:,} tokens" in str(result), repr(result)


def test_a_metadata_value_of_the_wrong_kind_names_its_key(llama, tmp_path):
    """A count given as a word: the line named no key ('invalid literal for int() with base 10: ...'), so a user could
    not tell which of the file's ~40 values was wrong."""
    bad = llama.set("llama.feed_forward_length", V.STRING, "lots")
    result = load_bounded(bad.write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and "wrong kind" in str(result), repr(result)
    assert "llama.feed_forward_length" in str(result), str(result)
