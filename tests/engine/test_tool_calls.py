"""engine/tool_calls.py: a template's call format, the calls read back out of an answer (whole, and streamed at
every split point alike), and the grammar of a required call in each format."""
from __future__ import annotations

import json

import pytest
from llguidance import LLMatcher, LLTokenizer

from engine.errors import ParleyError
from engine.tool_calls import CallStream, ToolCall, call_grammar, check_tools, parse_calls, tool_format

NAMES = {"get_weather", "get_time"}
PARIS = ToolCall("get_weather", '{"city": "Paris"}')
OSLO = ToolCall("get_weather", '{"city": "Oslo"}')
ANSWERS = [  # (format, answer, content, calls)
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
     "Let me look.", [PARIS, OSLO]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', "", [PARIS]),
    ("hermes", 'No call here, only <b>text</b>.', 'No call here, only <b>text</b>.', []),
    ("hermes", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', []),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa',
     '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa', []),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [PARIS, OSLO]),
    ("llama3", "Paris is sunny {usually}.", "Paris is sunny {usually}.", []),
    ("llama3", '{"answer": 42}', '{"answer": 42}', []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_weather", "arguments": {"city": "Oslo"}}]', "", [PARIS, OSLO]),
    ("mistral", "[link](http://x) and more", "[link](http://x) and more", []),
]


@pytest.mark.parametrize("fmt,answer,content,calls", ANSWERS)
def test_calls_are_read_out_of_a_whole_answer(fmt, answer, content, calls):
    assert parse_calls(fmt, answer, NAMES) == (content, calls)


@pytest.mark.parametrize("fmt,answer,content,calls", ANSWERS)
def test_a_streamed_answer_gives_what_the_whole_one_gives_at_every_split(fmt, answer, content, calls):
    """Content goes out while no call may be under way; joined with what `finish` returns it is the whole answer's
    content, wherever the pieces split (a marker cut in two included)."""
    for size in (1, 2, 3, 7):
        stream = CallStream(fmt, NAMES)
        sent = "".join(stream.feed(answer[i:i + size]) for i in range(0, len(answer), size))
        rest, found = stream.finish()
        assert (sent + rest, found) == (content, calls), (size, sent, rest)
        assert "<tool_call>" not in sent and "TOOL_CALLS" not in sent or not calls


def test_text_before_a_call_streams_before_the_answer_ends():
    stream = CallStream("hermes", NAMES)
    assert stream.feed("Let me look it up ") == "Let me look it up"  # the space may precede a call: held
    assert stream.feed("for you. <tool_") == " for you."
    assert stream.feed('call>{"name": "get_weather", "arguments": {"city": "Paris"}}') == ""
    assert stream.finish() == ("", [PARIS])


def test_an_answer_cut_short_is_released_as_its_text():
    stream = CallStream("llama3", NAMES)
    assert stream.feed('{"name": "get_weather", "param') == ""
    assert stream.release() == '{"name": "get_weather", "param'


@pytest.mark.parametrize("template,fmt", [
    ("{% for tool in tools %}{{ tool | tojson }}{% endfor %} <tool_call></tool_call>", "hermes"),
    ("{%- if tools %}{{ tools }}{% endif %}[TOOL_CALLS]", "mistral"),
    ("{%- if tools is not none %}{{ '<|python_tag|>' }}{% endif %}", "llama3"),
    ("{% for m in messages %}<tool_call>{% endfor %}", None),  # shows no tools
    ("{{ tools }} <|tool_call|>", None),  # a form not read here
    (None, None),
])
def test_the_format_comes_from_what_the_template_writes(template, fmt):
    assert tool_format(template) == fmt


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}]


@pytest.mark.parametrize("fmt,call", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("llama3", '{"name": "get_time", "parameters": {}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]'),
])
def test_a_required_call_grammar_takes_a_call_in_its_format_and_nothing_else(fmt, call):
    grammar = call_grammar(fmt, TOOLS)

    def accepts(text: str) -> bool:
        matcher = LLMatcher(LLTokenizer("byte"), grammar)  # one token a byte
        return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()

    assert accepts(call)
    assert not accepts(call.replace("get_", "set_"))
    assert not accepts("Sure! " + call)
    parsed = parse_calls(fmt, call, {"get_weather", "get_time"})
    assert parsed[1] and parsed[0] == ""


@pytest.mark.parametrize("tools,words", [
    ([], "non-empty array"),
    ([{"type": "function", "function": {"name": "a b"}}], "letters, digits"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], "description"),
])
def test_unusable_tools_are_named(tools, words):
    with pytest.raises(ParleyError, match=words):
        check_tools(tools)


def test_call_arguments_are_json_text():
    _, calls = parse_calls("llama3", '{"name": "get_time", "parameters": {"zone": "CET", "n": [1, 2]}}', NAMES)
    assert json.loads(calls[0].arguments) == {"zone": "CET", "n": [1, 2]}
