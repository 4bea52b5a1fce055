"""`tools` and `tool_choice` on /v1/chat/completions, served by a tiny model whose chat template shows tools and writes
calls as Qwen's do (`<tool_call>` blocks): a required call follows its tool's schema from random weights, streamed and
whole alike; the conversation after a call renders its arguments and result; what cannot be served is a 400 naming
the field."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest
from llguidance import LLMatcher, LLTokenizer

from engine.events import TurnStats
from server.api_error import APIError
from server.app import _chat_deltas, _tail_deltas
from server.bridge import ServerBridge
from server.protocol import ReasoningSplit, chat_response, parse_chat
from server.run import BackgroundServer
from server.tools import StreamedCalls, assistant_calls, request_tools
from tests.support.gguf_export import write_gguf

HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call these functions:\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    "Write each call as <tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- if message.content %}{{ message.content }}\n{% endif %}"
    "{%- for call in message.tool_calls %}<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- elif message.role != 'system' %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
XML_TEMPLATE = (  # Qwen3-Coder's and Qwen3.5's calls: <function=name> with a <parameter=key> a value
    "{%- if tools %}<|im_start|>system\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "Call as <tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n</function>\n</tool_call>"
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{%- for tool_call in message.tool_calls or [] %}{{- '<tool_call>\\n<function=' + tool_call.function.name + "
    "'>\\n' }}{%- for key, value in tool_call.function.arguments | items %}{{ '<parameter=' + key + '>\\n' }}"
    "{{ value }}{{ '\\n</parameter>\\n' }}{%- endfor %}{{ '</function>\\n</tool_call>' }}{%- endfor %}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DEEPSEEK_TEMPLATE = (  # as R1's: the calls fenced after function<｜tool▁sep｜>name; no tools shown
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}{% elif message['tool_calls'] %}"
    "{{ '<｜Assistant｜><｜tool▁calls▁begin｜>' }}{% for tool in message['tool_calls'] %}{{ '<｜tool▁call▁begin｜>' + "
    "tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n```json\\n' + tool['function']['arguments'] | "
    "tojson + '\\n```<｜tool▁call▁end｜>' }}{% endfor %}{{ '<｜tool▁calls▁end｜>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)
GLM_TEMPLATE = (  # GLM-4.5's and 4.6's: <tool_call>name, then <arg_key>/<arg_value> pairs
    "{%- if tools -%}<|im_start|>system\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n</tool_call>"
    "<|im_end|>\n{%- endif -%}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{%- for tc in m.tool_calls or [] %}"
    "{{ '\\n<tool_call>' + tc.function.name }}\n{% for k, v in tc.function.arguments.items() %}<arg_key>{{ k }}"
    "</arg_key>\n<arg_value>{{ v | tojson if v is not string else v }}</arg_value>\n{% endfor %}</tool_call>"
    "{%- endfor %}<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
CHAT = {"model": "tools", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 200,
        "tools": [WEATHER, TIME]}


@pytest.fixture(scope="module")
def tools_model(tiny_models, tmp_path_factory):
    """The tiny Qwen3 with a chat template that shows tools and writes `<tool_call>` blocks."""
    return _with_template(tiny_models, tmp_path_factory.mktemp("tools_model"), HERMES_TEMPLATE)


def _with_template(tiny_models, folder, template: str):
    """The tiny Qwen3 with `template` as its chat template, as a GGUF."""
    hf = shutil.copytree(tiny_models["qwen3"].hf_dir, folder / "hf")
    config = json.loads((hf / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = template
    (hf / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    model_config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    model_config["max_position_embeddings"] = 2048  # two tools' schemas in the system turn: ~500 of its tiny tokens
    (hf / "config.json").write_text(json.dumps(model_config), encoding="utf-8")
    return write_gguf(hf, folder / "tools.gguf")


@pytest.fixture(scope="module")
def tools_server(tools_model):
    bridge = ServerBridge().start()
    bridge.load(tools_model, alias="tools")
    try:
        with BackgroundServer(bridge) as server:
            yield server
    finally:
        bridge.shutdown()


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/chat/completions", json=body, timeout=60)


def _follows_weather(call: dict) -> bool:
    args = json.loads(call["function"]["arguments"])
    return (call["type"] == "function" and call["function"]["name"] == "get_weather" and set(args) == {"city", "days"}
            and isinstance(args["city"], str) and len(args["city"]) <= 12 and type(args["days"]) is int
            and 1 <= args["days"] <= 7)


def test_a_named_function_is_called_with_arguments_that_follow_its_schema(tools_server):
    body = CHAT | {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "n": 3,
                   "temperature": 1.0, "seed": 3}
    r = _post(tools_server, body)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert choice["finish_reason"] == "tool_calls"
        message = choice["message"]
        assert message["content"] is None and len(message["tool_calls"]) == 1
        assert _follows_weather(message["tool_calls"][0]), message
        assert message["tool_calls"][0]["id"].startswith("call-")


def test_required_calls_one_of_the_tools(tools_server):
    r = _post(tools_server, CHAT | {"tool_choice": "required", "temperature": 0})
    call = r.json()["choices"][0]["message"]["tool_calls"][0]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and _follows_weather(call) or \
        call["function"]["name"] == "get_time" and args in ({"zone": "UTC"}, {"zone": "CET"}), call


def _stream(server, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + "/chat/completions", json=body | {"stream": True}, timeout=60) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_a_streamed_call_goes_out_in_pieces_that_join_to_the_whole_answer(tools_server):
    """As OpenAI streams a call: its first delta carries index, id, type and name (arguments ""), the next ones pieces
    of its arguments as they are written; joined, they are the call the whole answer makes."""
    body = CHAT | {"tool_choice": "required", "temperature": 0}
    whole = _post(tools_server, body).json()["choices"][0]
    chunks = _stream(tools_server, body)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    pieces = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert "".join(d.get("content") or "" for d in deltas) == ""
    first, rest = pieces[0], pieces[1:]
    assert first["id"].startswith("call-") and first["type"] == "function" and first["function"]["arguments"] == ""
    assert len(rest) > 3 and all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in rest)
    joined = {"name": first["function"]["name"], "arguments": "".join(p["function"]["arguments"] for p in rest)}
    assert [joined] == [c["function"] for c in whole["message"]["tool_calls"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_openai_sdk_assembles_the_streamed_calls_as_the_whole_answer(tools_server):
    """The openai SDK's own stream helper (which joins the deltas as client libraries do) ends with the calls the
    answer made without streaming."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=tools_server.url, api_key="unused", max_retries=0)
    args = dict(model="tools", messages=CHAT["messages"], tools=CHAT["tools"], tool_choice="required",
                temperature=0, max_tokens=200)
    whole = client.chat.completions.create(**args).choices[0].message
    with client.chat.completions.stream(**args) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    assert json.loads(final.message.tool_calls[0].function.arguments)


def test_a_deepseek_model_gets_the_tools_after_the_clients_system_prompt():
    """Its template shows no tools: the request's system prompt carries them; other formats' prompts stay as sent."""
    body = CHAT | {"messages": [{"role": "system", "content": "Be brief."}, *CHAT["messages"]]}
    system = parse_chat(body, 4096, "deepseek", "ds").system
    assert system.startswith("Be brief.\n\n## Tools\n") and "### get_time" in system
    assert parse_chat(CHAT, 4096, "deepseek_v3_1", "ds").system.startswith("## Tools")
    assert parse_chat(body, 4096, "hermes", "tools").system == "Be brief."
    assert parse_chat(body | {"tool_choice": "none"}, 4096, "deepseek", "ds").system == "Be brief."


def test_required_with_parallel_calls_may_hold_several_calls():
    """parallel_tool_calls (OpenAI's default true): a required answer may make one call or more; false: one."""
    two = ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')
    body = CHAT | {"tool_choice": "required"}
    several = request_tools(body, "hermes", "tools")
    one = request_tools(body | {"parallel_tool_calls": False}, "hermes", "tools")

    def accepts(grammar: str, text: str) -> bool:
        matcher = LLMatcher(LLTokenizer("byte"), grammar)
        return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()

    assert accepts(several.grammar, two) and not accepts(one.grammar, two)
    assert len(several.read(two)[1]) == 2 and len(one.read(two)[1]) == 1


def test_one_call_an_answer_ends_the_answer_where_the_model_begins_a_second(tools_server, tools_model, monkeypatch):
    """parallel_tool_calls false is OpenAI's "zero or one tool is called". A model that went on to a second call had
    it dropped and wrote on, calls nobody would get, to max_tokens: one call, finish_reason "length", 300 tokens. It
    is stopped where its first call ends (it was where the second's name was known, 57 tokens later): the one call,
    "tool_calls". The model here is held to calls (the grammar of several, its end tokens barred), as a model that
    writes more than one call of itself would."""
    import server.tools
    from tokenizers import Tokenizer

    from engine.tool_calls import call_grammar

    monkeypatch.setattr(server.tools, "call_grammar", lambda fmt, tools, parallel: call_grammar(fmt, tools, True))
    vocab = Tokenizer.from_file(str(tools_model.parent / "hf" / "tokenizer.json"))
    barred = {str(vocab.token_to_id(t)): -100 for t in ("<|im_end|>", "<|endoftext|>")}
    body = CHAT | {"tool_choice": "required", "parallel_tool_calls": False, "temperature": 0, "max_tokens": 300,
                   "logit_bias": barred}
    whole = _post(tools_server, body).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and len(choice["message"]["tool_calls"]) == 1, choice
    assert whole["usage"]["completion_tokens"] < 75, whole["usage"]  # the call ends at ~60 (118: where a second began)
    chunks = _stream(tools_server, body)
    pieces = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert {p["index"] for p in pieces} == {0} and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "".join(p["function"]["arguments"] for p in pieces) == \
        choice["message"]["tool_calls"][0]["function"]["arguments"]


@pytest.mark.parametrize("text,reason,finish", [
    ('<think>Which tool?</think>Checking. <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n'
     '</tool_call>\nI asked for the time.', "stop", "tool_calls"),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', "length", "length"),  # cut short mid-call
    ("No call, only <b>text</b>.", "stop", "stop"),
])
def test_a_streamed_chat_answer_joins_to_the_whole_one(text, reason, finish):
    """What the server streams for an answer (its thought, content before and after a call, the call in pieces) and
    what it answers whole agree, token by token; a call cut short is the call as written in both."""
    tools = parse_chat(CHAT, 4096, "hermes", "tools").tools
    stats = TurnStats(9, 9, 9, None, None, 18, 4096)
    whole = chat_response("id", "tools", [(text, reason)], [stats], 0, tools=tools)["choices"][0]
    split, calls = ReasoningSplit(), StreamedCalls(tools, lambda: "call-1")
    deltas = [d for char in text for d in _chat_deltas(split.feed(char), calls)] + _tail_deltas(split, calls)
    joined = {"role": "assistant", "content": "".join(d.get("content", "") for d in deltas) or None}
    if thought := "".join(d.get("reasoning_content", "") for d in deltas):
        joined["reasoning_content"] = thought
    for piece in (p for d in deltas for p in d.get("tool_calls", [])):
        if "id" in piece:
            joined.setdefault("tool_calls", []).append({"id": piece["id"], "type": "function",
                                                        "function": dict(piece["function"])})
        else:
            joined["tool_calls"][piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
    whole_message = whole["message"] | {"tool_calls": [c | {"id": "call-1"} for c in whole["message"]["tool_calls"]]} \
        if "tool_calls" in whole["message"] else whole["message"]
    assert joined == whole_message and whole["finish_reason"] == finish
    assert not text.endswith(".") or joined["content"].endswith(".")  # text after a call is kept


@pytest.mark.parametrize("template,fmt", [(XML_TEMPLATE, "qwen_xml"), (DEEPSEEK_TEMPLATE, "deepseek"),
                                          (GLM_TEMPLATE, "glm")])
def test_a_model_writing_another_form_is_held_to_each_schema(tiny_models, tmp_path, template, fmt):
    """A template that writes Qwen3-Coder's XML calls (a string parameter up to its closing tag, the integer and the
    enum as their schemas say), GLM-4.5's <arg_key>/<arg_value> pairs, or DeepSeek R1's (its template shows no tools: the system prompt does): a required
    call through the model's own tokens follows the schemas and comes back as JSON arguments, streamed and whole
    alike."""
    model = _with_template(tiny_models, tmp_path, template)
    bridge = ServerBridge().start()
    try:
        served = bridge.load(model, alias="other")
        assert served.info["tool_calls"] == fmt
        with BackgroundServer(bridge) as server:
            body = CHAT | {"model": "other", "tool_choice": "required", "temperature": 0, "max_tokens": 400}
            whole = _post(server, body).json()["choices"][0]
            pieces = [tc for c in _stream(server, body) for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    finally:
        bridge.shutdown()
    call = whole["message"]["tool_calls"][0]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and _follows_weather(call) or \
        call["function"]["name"] == "get_time" and args in ({"zone": "UTC"}, {"zone": "CET"}), call
    assert "".join(p["function"]["arguments"] for p in pieces) == call["function"]["arguments"]
    assert whole["finish_reason"] == "tool_calls"


def test_auto_leaves_a_model_that_calls_nothing_its_text(tools_server):
    """Random weights write no `<tool_call>`: the answer is content, as without tools, and ends as it ended."""
    r = _post(tools_server, CHAT | {"temperature": 0, "max_tokens": 12})
    choice = r.json()["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "length"
    plain = _post(tools_server, CHAT | {"tool_choice": "none", "temperature": 0, "max_tokens": 12}).json()
    assert isinstance(choice["message"]["content"], str) and isinstance(plain["choices"][0]["message"]["content"], str)


def test_the_turn_after_a_call_shows_its_arguments_and_result(tools_server, tools_model):
    """An answer's call (arguments as OpenAI sends them, JSON text) and the tool's result render as the template
    writes them: the arguments as an object, not quoted twice."""
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call-1", "content": "sunny, 21 C"},
    ]
    r = _post(tools_server, CHAT | {"messages": messages, "temperature": 0, "max_tokens": 8})
    assert r.status_code == 200, r.text
    from engine.loading.gguf_file import open_gguf
    from engine.tokenizer.from_gguf import tokenizer_from_gguf

    tok = tokenizer_from_gguf(open_gguf(tools_model).metadata)
    req = parse_chat(CHAT | {"messages": messages}, 4096, "hermes", "tools")
    text = tok.decode(tok.apply_chat_template(req.messages(), tools=req.tools.tools), skip_special=False)
    assert '"arguments": {"city": "Paris", "days": 2}' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert '"name": "get_time"' in text  # the tools shown in the system turn
    assert text.endswith("<|im_start|>assistant\n")


def test_arguments_nested_past_the_parser_are_kept_as_their_text():
    """Arguments JSON text 5,000 brackets deep failed Python's parser with a RecursionError: a 500 and a traceback in
    the server's log. Kept as text, as arguments that are no JSON are."""
    deep = "[" * 5000 + "]" * 5000
    calls = assistant_calls([{"id": "c", "type": "function", "function": {"name": "f", "arguments": deep}}], 1)
    assert calls[0]["function"]["arguments"] == deep


@pytest.mark.parametrize("fields,param,words", [
    ({"tools": {"type": "function"}}, "tools", "non-empty array"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "\"type\": \"function\""),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "letters, digits"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "names two tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools", "JSON schema"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "not one of"),
    ({"tool_choice": "sometimes"}, "tool_choice", "must be 'none', 'auto', 'required'"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ({"response_format": {"type": "json_object"}}, "response_format", "cannot be combined"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "nonsense"}}}]}, "tools", "Invalid"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}]}, "messages[1]",
     "tool_call_id"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {}}]},
                   {"role": "user", "content": "x"}]}, "messages[0].tool_calls", "name"),
])
def test_unusable_tool_requests_are_a_400_naming_the_field(tools_server, fields, param, words):
    r = _post(tools_server, CHAT | fields)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert words in r.json()["error"]["message"]


def test_a_model_whose_template_shows_no_tools_refuses_them(server):
    """The plain ChatML tiny model: tools would be dropped by its template, so the request is refused, not answered
    as if they had been seen; without tools it serves as before."""
    body = CHAT | {"model": "tiny"}
    r = _post(server, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert "cannot call tools" in r.json()["error"]["message"]
    assert _post(server, {k: v for k, v in body.items() if k != "tools"}).status_code == 200


def test_a_required_argument_the_schema_allows_nowhere_is_a_400_naming_it():
    """An XML format's grammar names each argument: one required but neither listed nor allowed (additionalProperties
    false) is refused as the request arrives, with its name; allowed, the request is served."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"], "additionalProperties": False}}}
    body = {"messages": [], "tools": [tool], "tool_choice": "required"}
    with pytest.raises(APIError) as refused:
        request_tools(body, "qwen_xml", "m")
    assert refused.value.status == 400 and refused.value.param == "tools" and "'b'" in str(refused.value)
    tool["function"]["parameters"]["additionalProperties"] = True
    assert request_tools(body, "qwen_xml", "m").grammar
