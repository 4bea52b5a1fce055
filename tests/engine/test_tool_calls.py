"""engine/tool_calls.py: a template's call format, the calls read back out of an answer (whole, and streamed at
every split point alike), and the grammar of a required call in each format."""
from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
from llguidance import LLMatcher, LLTokenizer

from engine.errors import ParleyError
from engine.tool_calls import (CallDelta, CallStream, ToolCall, call_grammar, check_tools, joined, parse_calls,
                               tool_format, tools_prompt)

NAMES = {"get_weather", "get_time"}
PARIS = ToolCall("get_weather", '{"city": "Paris"}')
OSLO = ToolCall("get_weather", '{"city": "Oslo"}')
UTC = ToolCall("get_time", '{"zone": "UTC"}')
DS_R1 = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
         "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": \"UTC\"}\n```"
         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
ANSWERS = [  # (format, answer, content, calls)
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
     "Let me look.", [PARIS, OSLO]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', "", [PARIS]),
    ("hermes", '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>', "", [PARIS]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n\nI asked for '
               'the weather.', "I asked for the weather.", [PARIS]),  # text after a call is content
    ("hermes", 'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\nDone. ',
     "Checking.\nDone.", [PARIS]),
    ("hermes", 'No call here, only <b>text</b>.', 'No call here, only <b>text</b>.', []),
    ("hermes", 'See <tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
     'See <tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', []),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa',  # cut short: the call as written
     "", [ToolCall("get_weather", '{"city": "Pa')]),
    ("hermes", '<tool_call>{"name": "get_weather", "arg', '<tool_call>{"name": "get_weather", "arg', []),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [PARIS, OSLO]),
    ("llama3", "Paris is sunny {usually}.", "Paris is sunny {usually}.", []),
    ("llama3", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3", '{"name": "get_weather", "param', '{"name": "get_weather", "param', []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_weather", "arguments": {"city": "Oslo"}}]', "", [PARIS, OSLO]),
    ("mistral", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [PARIS]),  # the tag a control token
    ("mistral", "[link](http://x) and more", "[link](http://x) and more", []),
    ("mistral_v11", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}', "",
     [PARIS, UTC]),
    ("mistral_v11", 'get_weather{"city": "Paris"}get_time{"zone": "UTC"}', "", [PARIS, UTC]),  # tags left out
    ("mistral_v11", '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}', "", [PARIS]),
    ("mistral_v11", "get_weather is a tool.", "get_weather is a tool.", []),
    ("mistral_v11", "Sure. [TOOL_CALLS]get_time[ARGS]{\"zone\": \"UTC\"}", "Sure.", [UTC]),
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {"zone": "UTC"}}]', "", [PARIS, UTC]),
    ("granite", '[{"name": "get_time", "arguments": {"zone": "UTC"}}]', "", [UTC]),
    ("phi4", 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [PARIS]),
    ("phi4", "I like functools a lot.", "I like functools a lot.", []),
    ("deepseek", "Checking.\n\n" + DS_R1, "Checking.", [PARIS, UTC]),
    ("qwen_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                 "</tool_call>", "", [PARIS]),
    ("qwen_xml", "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                 "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n"
                 "</function>\n</tool_call>", "Let me check.", [PARIS, UTC]),
    ("qwen_xml", "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>",
     "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>", []),
    ("deepseek_v3_1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}"
                      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", [PARIS]),
    ("deepseek", DS_R1.replace("<｜tool▁calls▁begin｜>", "").replace("<｜tool▁call▁begin｜>", "").replace(
        "<｜tool▁sep｜>", "").replace("<｜tool▁call▁end｜>", "").replace("<｜tool▁calls▁end｜>", ""), "", [PARIS, UTC]),
    ("deepseek", "function words are nice.", "function words are nice.", []),  # control tokens left out
    ("deepseek_v3_1", 'get_weather{"city": "Paris"}get_time{"zone": "UTC"}', "", [PARIS, UTC]),  # left out
    ("deepseek_v3_1", "get_weather is a tool.", "get_weather is a tool.", []),
    ("glm", "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
            "\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>UTC</arg_value>\n</tool_call>",
     "Let me check.", [PARIS, UTC]),
    ("glm", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", "",  # GLM-4.7's
     [PARIS]),
    ("glm", "<tool_call>get_time\n</tool_call>\nDone.", "Done.", [ToolCall("get_time", "{}")]),
    ("glm", "<tool_call>rm_rf\n</tool_call>", "<tool_call>rm_rf\n</tool_call>", []),
    ("glm", '<tool_call>\n{"name": "get_time"}</tool_call>', '<tool_call>\n{"name": "get_time"}</tool_call>', []),
]


@pytest.mark.parametrize("fmt,answer,content,calls", ANSWERS)
def test_calls_are_read_out_of_a_whole_answer(fmt, answer, content, calls):
    assert parse_calls(fmt, answer, NAMES) == (content, calls)


@pytest.mark.parametrize("fmt,answer,content,calls", ANSWERS)
def test_a_streamed_answer_gives_what_the_whole_one_gives_at_every_split(fmt, answer, content, calls):
    """Content and call pieces go out as they come; joined as a client joins them (the content's pieces, each call's
    argument pieces) they are the whole answer's, wherever the pieces split (a marker cut in two included)."""
    for size in (1, 2, 3, 7):
        stream = CallStream(fmt, NAMES)
        pieces = [p for i in range(0, len(answer), size) for p in stream.feed(answer[i:i + size])]
        assert joined(pieces + stream.finish()) == (content, calls), size
        sent = "".join(p for p in pieces if isinstance(p, str))
        assert "<tool_call>" not in sent and "TOOL_CALLS" not in sent or not calls


@pytest.mark.parametrize("fmt,answer,content,calls", ANSWERS)
def test_an_answer_cut_anywhere_streams_as_it_reads_whole(fmt, answer, content, calls):
    """Cut short at any point (max_tokens), random pieces of it join to what the cut text reads whole; a call's
    arguments only grow, and nothing the model wrote is lost (a text that is no call is content)."""
    rng = random.Random(7)
    for cut in range(1, len(answer) + 1, 3):
        text, stream = answer[:cut], CallStream(fmt, NAMES)
        bounds = sorted({0, cut, *rng.sample(range(cut + 1), min(cut + 1, 6))})
        pieces = [p for a, b in zip(bounds, bounds[1:]) for p in stream.feed(text[a:b])] + stream.finish()
        whole = parse_calls(fmt, text, NAMES)
        assert joined(pieces) == whole, (cut, pieces)
        assert whole[0] or whole[1] or not text.strip(), text


@pytest.mark.parametrize("fmt,answer,content,calls", [  # the name first, the arguments an object
    a for a in ANSWERS if a[3] and '"arguments": "' not in a[1] and '{"arguments"' not in a[1]])
def test_each_call_goes_out_as_it_is_written(fmt, answer, content, calls):
    """A call's first piece names it (with arguments ""), before its arguments are whole; the arguments follow in
    pieces, as OpenAI streams them."""
    stream, deltas = CallStream(fmt, NAMES), []
    for i, char in enumerate(answer):
        deltas += [(i, d) for d in stream.feed(char) if isinstance(d, CallDelta)]
    for call_index, call in enumerate(calls):
        mine = [(i, d) for i, d in deltas if d.index == call_index]
        assert mine[0][1].name == call.name and mine[0][1].arguments == ""
        assert len(mine) > 2 or len(call.arguments) < 3, mine  # several pieces, not the whole at the end
        assert "".join(d.arguments for _, d in mine) == call.arguments
    names_first = [i for i, d in deltas if d.name is not None]
    assert names_first == sorted(names_first)


def test_a_name_written_after_the_arguments_holds_the_call_until_it_is_known():
    stream = CallStream("hermes", NAMES)
    assert stream.feed('<tool_call>{"arguments": {"city": "Paris"}') == []
    assert stream.feed(', "name": "get_wea') == []
    assert stream.feed('ther"}</tool_call>') == [
        CallDelta(0, "get_weather", ""), CallDelta(0, None, '{"city": "Paris"}')]


def test_a_json_answer_that_is_no_call_streams_from_its_first_other_key():
    stream = CallStream("llama3", NAMES)
    assert stream.feed('{"answer": 4') == ['{"answer": 4']
    assert stream.feed('2, "name": "get_time"}') == ['2, "name": "get_time"}']


def test_text_before_a_call_streams_before_the_answer_ends():
    stream = CallStream("hermes", NAMES)
    assert stream.feed("Let me look it up ") == ["Let me look it up"]  # the space may precede a call: held
    assert stream.feed("for you. <tool_") == [" for you."]
    assert stream.feed('call>{"name": "get_weather", "arguments": {"city": "Par') == [
        CallDelta(0, "get_weather", ""), CallDelta(0, None, '{"city": "Par')]
    assert stream.feed('is"}}') == [CallDelta(0, None, 'is"}')]
    assert stream.finish() == [] and stream.called


def test_a_limit_leaves_later_calls_out():
    answer = ANSWERS[0][1]
    assert parse_calls("hermes", answer, NAMES, limit=1) == ("Let me look.", [PARIS])


def test_a_call_past_the_limit_ends_the_reading():
    """The end of the last call allowed is where the server stops the answer (parallel_tool_calls false): text after it
    is not content, and the stream says it is full once that call's text has ended. Before, 'Done.' was content and
    nothing told the call apart; then the stream was full only once a second call's name was known."""
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    stream = CallStream("hermes", NAMES, limit=1)
    cut = one.index("}}")
    assert [d for d in stream.feed(one[:cut]) if isinstance(d, str)] == [] and not stream.full
    assert stream.feed(one[cut:]) == [CallDelta(0, None, "}")] and stream.full  # its arguments' object closed
    assert stream.feed(one + "Done.") == [] and stream.finish() == []
    assert parse_calls("hermes", one * 2 + "Done.", NAMES, limit=1) == ("", [PARIS])


@pytest.mark.parametrize("fmt,answer,content,calls", [a for a in ANSWERS if len(a[3]) > 1])
def test_one_call_allowed_is_full_where_its_text_ends_before_a_second_begins(fmt, answer, content, calls):
    """In every format the stream of one call an answer is full as soon as the first call has ended (so the server
    stops the model there), by the second call's first character (where no marker tells the end: DeepSeek's left out)
    rather than once its name is known: the tiny model wrote 57 tokens more, which were then dropped."""
    stream, pieces = CallStream(fmt, NAMES, limit=1), []
    for at, char in enumerate(answer):
        pieces += stream.feed(char)
        if stream.full:
            break
    second = answer.index(calls[1].name, answer.index(calls[0].name) + len(calls[0].name))
    assert stream.full and at <= second, (at, second)
    assert joined(pieces + stream.finish())[1] == calls[:1]


@pytest.mark.parametrize("template,fmt", [
    ("{% for tool in tools %}{{ tool | tojson }}{% endfor %} <tool_call></tool_call>", "hermes"),
    ("{%- if tools %}{{ tools }}{% endif %}[TOOL_CALLS]", "mistral"),
    ("{%- if tools %}{{ tools }}{% endif %}{{ '[TOOL_CALLS]' + call.name + '[ARGS]' + args }}", "mistral_v11"),
    ("{%- if tools is not none %}{{ '<|python_tag|>' }}{% endif %}", "llama3"),
    ("{%- if tools %}<|start_of_role|>available_tools<|end_of_role|>{{ tools }}{% endif %}<|tool_call|>", "granite"),
    ("{% if tools %}{{ '<|tool|>' + (tools | tojson) + '<|/tool|>' }}{% endif %}", "phi4"),
    ("{{ tools }}{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + "
     "tool['function']['name'] + '\\n```json'}}", "deepseek"),
    ("{{ tools }}{{'<｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + "
     "tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}", "deepseek_v3_1"),
    ("{{ tools }}{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}", "qwen_xml"),  # not hermes
    ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}{{ '\\n<tool_call>' + tc.name }}\n{% for k, v in "
     "_args.items() %}\n<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>\n{% endfor %}", "glm"),  # GLM-4.5
    ("{%- for tool in message['tool_calls']-%}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
     "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json'}}{% endfor %}", "deepseek"),  # R1's, no tools
    ("{%- for tool in message['tool_calls'] -%}{{'<｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + "
     "tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}{% endfor %}", "deepseek_v3_1"),  # V3.1's, no tools
    ("{% for m in messages %}<tool_call>{% endfor %}", None),  # shows no tools
    ("{% if message['role'] == 'system' and 'tools' in message %}{{ '<|tool|>' + message['tools'] + '<|/tool|>' }}"
     "{% endif %}", None),  # Phi-4-mini's own template: a system message's 'tools', not the tools a client sends
    (None, None),
])
def test_the_format_comes_from_what_the_template_writes(template, fmt):
    assert tool_format(template) == fmt


def test_deepseek_is_shown_the_tools_in_its_system_prompt():
    """DeepSeek's templates show no tools: the system prompt says them as its model cards do, with the call form the
    model writes (and a client's required call is held to)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": {"type": "object", "properties": {"city": {}}}}}]
    prompt = tools_prompt("deepseek_v3_1", tools)
    assert "### get_weather\nDescription: The weather in a city" in prompt
    assert 'Parameters: {"type": "object", "properties": {"city": {}}}' in prompt
    assert "<｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>" in prompt
    assert "function<｜tool▁sep｜>tool_call_name\n```json\ntool_call_arguments\n```" in tools_prompt("deepseek", tools)
    assert tools_prompt("hermes", tools) is None


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}]


ONE_AND_TWO = {  # a format's text of one call, and of two
    "hermes": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
               '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'),
    "llama3": ('{"name": "get_time", "parameters": {}}', '; {"name": "get_weather", "parameters": {"city": "Oslo"}}'),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}', ', {"name": "get_time", '
                '"arguments": {}}', "]"),
    "mistral_v11": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}', "[TOOL_CALLS]get_time[ARGS]{}"),
    "granite": ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}', ', {"name": "get_time", '
                '"arguments": {}}', "]"),
    "phi4": ('functools[{"name": "get_weather", "arguments": {"city": "Oslo"}}', ', {"name": "get_time", '
             '"arguments": {}}', "]"),
    "deepseek": ("<｜tool▁calls▁begin｜>" + DS_R1.split("\n<｜tool▁call▁begin｜>")[0].removeprefix("<｜tool▁calls▁begin｜>"),
                 "\n<｜tool▁call▁begin｜>" + DS_R1.split("\n<｜tool▁call▁begin｜>")[1].removesuffix("<｜tool▁calls▁end｜>"),
                 "<｜tool▁calls▁end｜>"),
    "qwen_xml": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
                 "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>"),
    "deepseek_v3_1": ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo"}<｜tool▁call▁end｜>',
                      "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"),
    "glm": ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
            "\n<tool_call>get_time\n</tool_call>"),
}


def _accepts(grammar: str, text: str) -> bool:
    matcher = LLMatcher(LLTokenizer("byte"), grammar)  # one token a byte
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


@pytest.mark.parametrize("fmt", sorted(ONE_AND_TWO))
def test_a_required_call_grammar_takes_calls_in_its_format_and_nothing_else(fmt):
    """Round trip of each format: what the grammar takes, the stream reads back as the calls; one call, or with
    parallel_tool_calls one or more."""
    first, second, *close = ONE_AND_TWO[fmt]
    one, two = first + "".join(close), first + second + "".join(close)
    single, several = call_grammar(fmt, TOOLS), call_grammar(fmt, TOOLS, parallel=True)
    assert _accepts(single, one) and _accepts(several, one) and _accepts(several, two)
    assert not _accepts(single, two)
    assert not _accepts(several, one.replace("get_", "set_"))
    assert not _accepts(several, "Sure! " + one)
    assert not _accepts(several, two.replace('"Oslo"', "1").replace('"Paris"', "1")) or fmt in ("qwen_xml", "glm")
    content, calls = parse_calls(fmt, two, NAMES)
    assert content == "" and sorted(c.name for c in calls) == ["get_time", "get_weather"], calls


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


XML_TOOLS = [{"type": "function", "function": {"name": "plan", "parameters": {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 24}, "days": {"type": "integer"}, "zone": {"enum": ["UTC", "CET"]},
    "tags": {"type": "array", "items": {"type": "string"}}, "done": {"type": "boolean"}},
    "required": ["title", "days"]}}}]
XML_SCHEMAS = {"plan": XML_TOOLS[0]["function"]["parameters"]}
XML_PLAN = ("<tool_call>\n<function=plan>\n<parameter=title>\n42 \"days\" <b>\nof rain\n</parameter>\n"
            "<parameter=days>\n7\n</parameter>\n<parameter=zone>\nUTC\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n"
            "</parameter>\n<parameter=done>\nTrue\n</parameter>\n</function>\n</tool_call>")


def test_xml_values_are_typed_by_the_schema_and_strings_stream_as_written():
    """Qwen's XML values are text: the tool's schema says which are strings (kept as written, "42 ..." included) and
    which JSON; a string's characters go out as they come, before its closing tag."""
    content, calls = parse_calls("qwen_xml", XML_PLAN, XML_SCHEMAS)
    assert content == "" and json.loads(calls[0].arguments) == {
        "title": '42 "days" <b>\nof rain', "days": 7, "zone": "UTC", "tags": ["a", "b"], "done": True}
    stream = CallStream("qwen_xml", XML_SCHEMAS)
    head = stream.feed(XML_PLAN[:XML_PLAN.index("of rain") + 2])
    assert joined(head)[1][0].arguments == '{"title": "42 \\"days\\" <b>\\nof'


def test_xml_grammar_follows_each_parameter_schema():
    """Each parameter as its schema says (a JSON value as JSON writes it: a boolean `true`)."""
    grammar, plan = call_grammar("qwen_xml", XML_TOOLS), XML_PLAN.replace("True", "true")
    assert _accepts(grammar, plan)
    assert not _accepts(grammar, plan.replace("\n7\n", "\nseven\n"))  # an integer
    assert not _accepts(grammar, plan.replace("of rain", "of rain and wind"))  # the string's maxLength
    assert not _accepts(grammar, plan.replace("\nUTC\n", "\nPST\n"))  # the enum
    assert not _accepts(grammar, plan.replace("<parameter=days>\n7\n</parameter>\n", ""))  # required
    assert _accepts(grammar, plan.replace("<parameter=done>\ntrue\n</parameter>\n", ""))  # optional


MARKERS = {"<|tool_call|>": True, "[TOOL_CALLS]": True, "[ARGS]": True, "<tool_call>": False, "</tool_call>": False,
           "<arg_key>": False, "</arg_key>": False, "<arg_value>": False, "</arg_value>": False,
           **dict.fromkeys(["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                            "<｜tool▁calls▁end｜>"], True)}  # DeepSeek's: GGUFs type <｜…｜> control


@pytest.fixture(scope="module")
def marked_lm(tiny_models, tmp_path_factory):
    """The tiny Qwen3 with tool-call markers in its vocabulary as one token each (control tokens, and Qwen's and GLM's
    tags as added plain ones, as their GGUFs type them), new embedding rows for each."""
    from safetensors.numpy import load_file, save_file
    from tokenizers import AddedToken, Tokenizer

    from engine.loading.loader import load_model
    from tests.support.gguf_export import write_gguf

    hf = shutil.copytree(tiny_models["qwen3"].hf_dir, tmp_path_factory.mktemp("marked") / "hf")
    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
    tok.add_tokens([AddedToken(text, special=special, normalized=False) for text, special in MARKERS.items()])
    tok.save(str(hf / "tokenizer.json"))
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    grown, config["vocab_size"] = tok.get_vocab_size(), tok.get_vocab_size()
    (hf / "config.json").write_text(json.dumps(config), encoding="utf-8")
    weights = load_file(str(hf / "model.safetensors"))
    rng = np.random.default_rng(0)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = weights[name]
        new = rng.normal(0, 0.02, (grown - len(rows), rows.shape[1]))
        weights[name] = np.concatenate([rows, new]).astype(rows.dtype)
    save_file(weights, str(hf / "model.safetensors"), metadata={"format": "pt"})
    return load_model(write_gguf(hf, hf.parent / "marked.gguf"))


@pytest.mark.parametrize("fmt,markers", [("granite", ["<|tool_call|>"]), ("mistral_v11", ["[TOOL_CALLS]", "[ARGS]"]),
                                         ("hermes", ["<tool_call>", "</tool_call>"]),
                                         ("glm", ["<tool_call>", "<arg_key>", "</arg_value>", "</tool_call>"]),
                                         ("deepseek", ["<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁calls▁end｜>"]),
                                         ("deepseek_v3_1", ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁end｜>"])])
def test_a_required_call_writes_each_marker_as_its_one_token(marked_lm, fmt, markers):
    """A marker the model holds as one token (a control token, or Qwen's <tool_call> added to its vocabulary) is that
    token under the grammar, greedy, not its text spelled from pieces the model never wrote; the answer reads as a
    call whether the decoded text keeps the marker or leaves a control token out."""
    from bench.runs import RunConfig, make_batcher
    from engine.constraint.guide import Grammars
    from engine.sampling import SamplingParams
    from tests.support.engine_helpers import staggered_sequences

    lm, tools = marked_lm, [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}]
    ids = [lm.tokenizer.token_to_id(m) for m in markers]
    grammar = Grammars(lm.tokenizer, lm.args.vocab_size).guide
    seq = staggered_sequences(make_batcher(lm, 1, RunConfig(max_seq_len=256)), [lm.tokenizer.encode("Weather?")],
                              [0], SamplingParams(max_tokens=120), lm.tokenizer.stop_ids,
                              [lambda: grammar(call_grammar(fmt, tools))])[0]
    answer = [t for t in seq.generated if t not in lm.tokenizer.stop_ids]
    assert seq.finish_reason == "stop" and answer[0] == ids[0] and all(answer.count(i) == 1 for i in ids), answer
    for text in (lm.tokenizer.decode(answer), lm.tokenizer.decode(answer, skip_special=True)):
        content, calls = parse_calls(fmt, text, {"get_weather": tools[0]["function"]["parameters"]})
        assert content == "" and [c.name for c in calls] == ["get_weather"], text
    assert lm.tokenizer.decode(answer, skip_special=True).startswith(markers[0])  # control-typed ones kept too


def test_a_marker_outside_the_vocabulary_stays_text():
    """Only a marker the vocabulary holds as one token is named by its id; the grammar keeps the others' text."""
    from engine.constraint.grammar import with_control_tokens

    grammar = call_grammar("mistral_v11", TOOLS[:1])
    named = with_control_tokens(grammar, {"[TOOL_CALLS]": 7}.get)
    assert 'control_token_2: <[7]>' in named and 'control_token_3: "[ARGS]"' in named
    assert with_control_tokens(grammar, lambda text: None) == grammar


GLM_PLAN = ("<tool_call>plan\n<arg_key>title</arg_key>\n<arg_value>42 \"days\" <b>\nof rain</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>7</arg_value>\n<arg_key>zone</arg_key>\n<arg_value>UTC</arg_value>\n"
            "<arg_key>tags</arg_key>\n<arg_value>[\"a\", \"b\"]</arg_value>\n<arg_key>done</arg_key>\n"
            "<arg_value>true</arg_value>\n</tool_call>")


def test_glm_values_are_typed_by_the_schema_and_strings_stream_as_written():
    content, calls = parse_calls("glm", GLM_PLAN, XML_SCHEMAS)
    assert content == "" and json.loads(calls[0].arguments) == {
        "title": '42 "days" <b>\nof rain', "days": 7, "zone": "UTC", "tags": ["a", "b"], "done": True}
    head = CallStream("glm", XML_SCHEMAS).feed(GLM_PLAN[:GLM_PLAN.index("of rain") + 2])
    assert joined(head)[1][0].arguments == '{"title": "42 \\"days\\" <b>\\nof'


def test_glm_grammar_follows_each_argument_schema():
    grammar = call_grammar("glm", XML_TOOLS)
    assert _accepts(grammar, GLM_PLAN)
    assert not _accepts(grammar, GLM_PLAN.replace(">7<", ">seven<"))  # an integer
    assert not _accepts(grammar, GLM_PLAN.replace("of rain", "of rain and wind"))  # the string's maxLength
    assert not _accepts(grammar, GLM_PLAN.replace(">UTC<", ">PST<"))  # the enum
    assert not _accepts(grammar, GLM_PLAN.replace("<arg_key>days</arg_key>\n<arg_value>7</arg_value>\n", ""))
    assert _accepts(grammar, GLM_PLAN.replace("<arg_key>done</arg_key>\n<arg_value>true</arg_value>\n", ""))


def _xml_call(fmt: str, name: str, arguments: dict[str, str]) -> str:
    """A call as the format's template writes it, each value's text as given."""
    if fmt == "glm":
        pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in arguments.items())
        return f"<tool_call>{name}\n{pairs}</tool_call>"
    pairs = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{pairs}</function>\n</tool_call>"


@pytest.mark.parametrize("fmt", ["qwen_xml", "glm"])
def test_a_string_arguments_pattern_and_min_length_are_held(fmt):
    """As JSON Schema reads them: a pattern found anywhere in the value unless ^ or $ anchor it, and a minLength
    without a maxLength."""
    tool = {"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"}, "note": {"type": "string", "minLength": 4},
        "seat": {"type": "string", "pattern": "[0-9]"}}, "required": ["code", "note", "seat"]}}}
    grammar = call_grammar(fmt, [tool])

    def takes(code: str, note: str, seat: str) -> bool:
        return _accepts(grammar, _xml_call(fmt, "book", {"code": code, "note": note, "seat": seat}))

    assert takes("CDG", "window", "12A") and takes("CDG", "aisle", "row 7")
    assert not takes("CDGX", "window", "12A") and not takes("cdg", "window", "12A")  # anchored
    assert not takes("CDG", "win", "12A")  # minLength
    assert not takes("CDG", "window", "aisle")  # no digit anywhere


@pytest.mark.parametrize("fmt", ["qwen_xml", "glm"])
def test_arguments_the_schema_does_not_list_follow_additional_properties(fmt):
    """Listed properties and no others unless the schema allows them (then any key, its value as it says); a
    required argument it neither lists nor allows can never be written: refused when the grammar is built."""
    def tool(**parameters) -> list[dict]:
        return [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string"}}, **parameters}}}]

    listed = call_grammar(fmt, tool())
    assert _accepts(listed, _xml_call(fmt, "f", {"a": "x"}))
    assert not _accepts(listed, _xml_call(fmt, "f", {"a": "x", "zz": "1"}))
    free = call_grammar(fmt, tool(additionalProperties={"type": "integer"}, required=["b"]))
    assert _accepts(free, _xml_call(fmt, "f", {"b": "2", "zz": "1"}))
    assert not _accepts(free, _xml_call(fmt, "f", {"zz": "1"}))  # b is required
    assert not _accepts(free, _xml_call(fmt, "f", {"b": "two"}))  # others are integers
    with pytest.raises(ParleyError, match="requires 'b', which its parameters neither list nor allow"):
        call_grammar(fmt, tool(additionalProperties=False, required=["a", "b"]))
    strings = tool(additionalProperties={"type": "string"})[0]["function"]["parameters"]
    _, calls = parse_calls(fmt, _xml_call(fmt, "f", {"a": "1", "zz": "42"}), {"f": strings})
    assert json.loads(calls[0].arguments) == {"a": "1", "zz": "42"}  # typed as the others' schema says


LONG_TEXT = 'if a < b:\n    print("</para", \'x\\\\\')\n\n' * 8  # what may end a string or a value, inside one
LONG_JSON = json.dumps(LONG_TEXT, ensure_ascii=False)[1:-1]
WRITE = {"write": {"type": "object", "properties": {"text": {"type": "string"}}}}
LONG_CALLS = [  # a call whose one argument is a long string, in the forms of JSON and of text values
    ("hermes", '<tool_call>\n{"name": "write", "arguments": {"text": "' + LONG_JSON + '"}}\n</tool_call>'),
    ("mistral_v11", '[TOOL_CALLS]write[ARGS]{"text": "' + LONG_JSON + '"}'),
    ("deepseek_v3_1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write<｜tool▁sep｜>{\"text\": \"" + LONG_JSON +
     "\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ("qwen_xml", "<tool_call>\n<function=write>\n<parameter=text>\n" + LONG_TEXT + "\n</parameter>\n</function>\n"
                 "</tool_call>"),
    ("glm", "<tool_call>write\n<arg_key>text</arg_key>\n<arg_value>" + LONG_TEXT + "</arg_value>\n</tool_call>"),
]


def _counted_reads(monkeypatch, fmt: str) -> list[str]:
    """The texts `fmt`'s reader is given from now on (the test's CallStreams read through it)."""
    import dataclasses

    from engine import tool_calls

    form, reads = tool_calls.FORMATS[fmt], []

    def counted(read):
        return lambda text, names: reads.append(text) or read(text, names)

    monkeypatch.setitem(tool_calls.FORMATS, fmt, dataclasses.replace(  # a stream's own reader, where it has one
        form, read=counted(form.read), reader=form.reader and (lambda: counted(form.reader()))))
    return reads


def _streamed_in(fmt: str, answer: str, size: int, names: dict = WRITE) -> tuple[str, list[ToolCall]]:
    stream = CallStream(fmt, names)
    return joined([p for i in range(0, len(answer), size) for p in stream.feed(answer[i:i + size])] + stream.finish())


def _cut_anywhere_reads_as_whole(fmt: str, answer: str, step: int, samples: int, seed: int,
                                 names: dict = WRITE) -> None:
    """Cut every `step` characters, split at `samples` random places, the pieces join to what the cut reads whole."""
    rng = random.Random(seed)
    for cut in range(1, len(answer) + 1, step):
        text, stream = answer[:cut], CallStream(fmt, names)
        bounds = sorted({0, cut, *rng.sample(range(cut + 1), min(cut + 1, samples))})
        pieces = [p for a, b in zip(bounds, bounds[1:]) for p in stream.feed(text[a:b])] + stream.finish()
        assert joined(pieces) == parse_calls(fmt, text, names), cut


@pytest.mark.parametrize("fmt,answer", LONG_CALLS)
def test_a_long_string_argument_streams_as_it_reads_whole_and_is_not_read_again_at_each_piece(fmt, answer,
                                                                                               monkeypatch):
    """The reader read the whole call again at every piece (~28 µs a piece at 8.7k characters, quadratic): a piece
    inside an open string now only lengthens it. Wherever the pieces split (an escape, a quote, '<' or a closing
    tag's start cut in two), they join to the whole answer's call; 4-character pieces read the call ~17 times in
    ~100 pieces (before: once a piece)."""
    reads = _counted_reads(monkeypatch, fmt)
    want = ("", [ToolCall("write", json.dumps({"text": LONG_TEXT}, ensure_ascii=False))])
    for size in (1, 2, 3, 4, 7):
        reads.clear()
        assert _streamed_in(fmt, answer, size) == want, size
        assert len(reads) < len(answer) / size / 4, (size, len(reads))
    _cut_anywhere_reads_as_whole(fmt, answer, 5, 12, 3)


EDITS = [{"at": k, "s": "a < b\n</para"} for k in range(30)]  # what may end a value, inside one
EDIT = {"edit": {"type": "object", "properties": {"edits": {"type": "array"}}}}
LONG_VALUES = [  # a call whose one argument is a long value that is not text, in the forms of text values
    ("qwen_xml", "<tool_call>\n<function=edit>\n<parameter=edits>\n" + json.dumps(EDITS) + "\n</parameter>\n"
                 "</function>\n</tool_call>"),
    ("glm", "<tool_call>edit\n<arg_key>edits</arg_key>\n<arg_value>" + json.dumps(EDITS) + "</arg_value>\n</tool_call>"),
]


@pytest.mark.parametrize("fmt,answer", LONG_VALUES)
def test_a_long_value_that_is_not_text_is_read_once_it_ends_not_at_each_piece(fmt, answer, monkeypatch):
    """Nothing of a value that is not text goes out before its closing tag, yet the call was read again at every piece
    inside it: ~29 µs a piece at 1k pieces, ~53 µs at 10k (quadratic). A piece that holds no closing tag now only
    lengthens it; wherever the pieces split (a closing tag's start cut in two), they join to the whole answer's call."""
    reads = _counted_reads(monkeypatch, fmt)
    want = ("", [ToolCall("edit", json.dumps({"edits": EDITS}))])
    for size in (1, 3, 4, 7):
        reads.clear()
        assert _streamed_in(fmt, answer, size, EDIT) == want, size
        assert len(reads) < len(answer) / size / 4, (size, len(reads))
    _cut_anywhere_reads_as_whole(fmt, answer, 11, 12, 3, EDIT)


MANY = {f"a{k}": [f"v{k}", {"n": k, "s": "}]\\\"{"}] if k % 7 == 0 else f"v{k}" for k in range(120)}
MANY_JSON = json.dumps(MANY, ensure_ascii=False)
MANY_CALLS = [  # a call of many short arguments (nested ones holding brackets in strings), in the JSON forms
    ("hermes", '<tool_call>\n{"name": "write", "arguments": ' + MANY_JSON + '}\n</tool_call>'),
    ("llama3", '{"name": "write", "parameters": ' + MANY_JSON + '}'),
    ("granite", '<|tool_call|>[{"name": "write", "arguments": ' + MANY_JSON + '}]'),
    ("mistral_v11", '[TOOL_CALLS]write[ARGS]' + MANY_JSON),
    ("deepseek_v3_1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write<｜tool▁sep｜>" + MANY_JSON +
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
]


@pytest.mark.parametrize("fmt,answer", MANY_CALLS)
def test_many_short_arguments_stream_as_they_read_whole_and_the_call_is_not_read_again(fmt, answer, monkeypatch):
    """A piece that closed a string read the whole call again, and so did every piece between two strings: a call of
    1,000 short arguments in 4-character pieces took 3 s (quadratic). While the model's JSON arguments are open, a
    piece only lengthens them; the call is read again only until its name is known and once its arguments close."""
    reads = _counted_reads(monkeypatch, fmt)
    for size in (1, 3, 4):
        reads.clear()
        assert _streamed_in(fmt, answer, size) == ("", [ToolCall("write", MANY_JSON)]), size
        assert len(reads) < 40 + 60 / size, (size, len(reads))  # the head and the end, not ~1 a piece (~1,000)
    _cut_anywhere_reads_as_whole(fmt, answer, 37, 40, 5)


MANY_TEXT = {f"a{k}": "x < y\n</para" if k % 7 == 0 else f"v{k}" for k in range(120)}
MANY_TAGS = [  # a call of many short arguments written as text values
    ("qwen_xml", "<tool_call>\n<function=write>\n" + "".join(
        f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in MANY_TEXT.items()) + "</function>\n</tool_call>"),
    ("glm", "<tool_call>write\n" + "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in MANY_TEXT.items()) + "</tool_call>"),
]


@pytest.mark.parametrize("fmt,answer", MANY_TAGS)
def test_many_text_arguments_stream_as_they_read_whole_and_each_is_read_about_once(fmt, answer, monkeypatch):
    """Qwen XML and GLM calls were read from their first argument at every piece outside a value: a call of 1,000
    short arguments in 4-character pieces took 29 s (quadratic). A stream's reader now resumes after the arguments it
    has read whole: each is read about once a piece that reaches it, not once every later piece (~60 a piece here)."""
    from engine import tool_call_xml

    one = "_parameter" if fmt == "qwen_xml" else "_glm_pair"
    arguments, read_one = [], getattr(tool_call_xml, one)
    monkeypatch.setattr(tool_call_xml, one, lambda *a: arguments.append(a[1]) or read_one(*a))
    want = ("", [ToolCall("write", json.dumps(MANY_TEXT, ensure_ascii=False))])
    for size in (1, 3, 4):
        arguments.clear()
        assert _streamed_in(fmt, answer, size) == want, size
        assert len(arguments) < 3 * len(answer) / size, (size, len(arguments))  # before: ~60 times that
    _cut_anywhere_reads_as_whole(fmt, answer, 37, 40, 5)


def test_a_streams_second_call_is_read_from_its_own_start():
    """The reader's memory of a call is kept only while its text grows: a second call to the same tool, its arguments
    at the same place in its own section, is read from its first argument (not resumed after the first call's)."""
    first = "<tool_call>\n<function=write>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
    answer = first + "</function>\n</tool_call>\n" + first.replace("1", "3") + "</function>\n</tool_call>"
    stream = CallStream("qwen_xml", {"write": {}})
    pieces = [p for i in range(0, len(answer), 5) for p in stream.feed(answer[i:i + 5])] + stream.finish()
    assert joined(pieces) == ("", [ToolCall("write", '{"a": 1, "b": 2}'), ToolCall("write", '{"a": 3, "b": 2}')])
