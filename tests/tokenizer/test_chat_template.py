"""Chat templates: the built-in Gemma format, templates in the style of Qwen and Llama 3, and the sandbox."""
from __future__ import annotations

import pytest

from engine.errors import TemplateError
from engine.tokenizer import ChatTemplate, gemma_chat_template, plain_chat_template, tokenizer_from_gguf


from tests.support.gemma import CHATML_TEMPLATE, LLAMA3_TEMPLATE, sentencepiece_metadata, train_sentencepiece  # noqa: E402

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "What is 2+2?"},
]


def test_gemma_full_conversation() -> None:
    expected = (
        "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert gemma_chat_template().render(CONVERSATION) == expected


def test_gemma_without_system_or_generation_prompt() -> None:
    text = gemma_chat_template().render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n"


def test_gemma_rejects_unknown_role() -> None:
    with pytest.raises(TemplateError, match="tool"):
        gemma_chat_template().render([{"role": "tool", "content": "{}"}])


def test_chatml() -> None:
    text = ChatTemplate(CHATML_TEMPLATE).render(CONVERSATION[:2])
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"


def test_llama3() -> None:
    text = ChatTemplate(LLAMA3_TEMPLATE, bos_token="<|begin_of_text|>").render([{"role": "user", "content": " Hi \n"}])
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_plain_fallback() -> None:
    text = plain_chat_template().render(CONVERSATION)
    assert text == "Be brief.\n\nUser: Hi!\nAssistant: Hello.\nUser: What is 2+2?\nAssistant:"


def test_extra_variables_and_helpers() -> None:
    template = ChatTemplate("{{ tools | tojson }} {{ strftime_now('%Y') | length }} {{ bos_token }}", bos_token="<s>")
    assert template.render([], tools=[{"name": "a<b>"}]) == '[{"name": "a<b>"}] 4 <s>'


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ messages.append(1) }}",  # the immutable sandbox forbids mutating the conversation
        "{% for m in messages %}{{ m.__class__.__mro__ }}{% endfor %}",
    ],
)
def test_hostile_templates_are_stopped(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_raise_exception_keeps_the_message() -> None:
    with pytest.raises(TemplateError, match="roles must alternate"):
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render([])


# Gemma 2's shape: no system role, strict alternation, each refused through raise_exception
NO_SYSTEM_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' "
    "+ message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
DROPS_SYSTEM_TEMPLATE = "{% for m in messages %}{% if m['role'] != 'system' %}[{{ m['role'] }}] {{ m['content'] }}\n{% endif %}{% endfor %}"


@pytest.mark.parametrize("source", [NO_SYSTEM_TEMPLATE, DROPS_SYSTEM_TEMPLATE])
def test_a_template_without_a_system_role_gets_it_in_the_first_user_message(source: str) -> None:
    text = ChatTemplate(source, bos_token="<bos>").render(CONVERSATION)
    assert "Be brief.\n\nHi!" in text and text.count("Be brief.") == 1 and "What is 2+2?" in text
    assert ChatTemplate(source, bos_token="<bos>").render(CONVERSATION[1:]).count("Be brief.") == 0


def test_a_template_with_a_system_role_renders_as_written() -> None:
    text = ChatTemplate(CHATML_TEMPLATE).render(CONVERSATION)
    assert "Be brief.\n\nHi!" not in text and "system\nBe brief." in text


def test_other_refusals_still_refuse() -> None:
    turns = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]  # an answer first
    with pytest.raises(TemplateError, match="roles must alternate"):
        ChatTemplate(NO_SYSTEM_TEMPLATE).render(turns)


@pytest.mark.parametrize("source", ["{% for %}", "{{ 1 / 0 }}", "{{ messages[5]['content'].upper() }}"])
def test_broken_templates(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([])


def test_gguf_without_template_on_gemma_gets_builtin() -> None:
    metadata = sentencepiece_metadata(train_sentencepiece(add_dummy_prefix=False), False)
    metadata["general.architecture"] = "gemma3"
    assert tokenizer_from_gguf(metadata).chat_template.source == gemma_chat_template().source
    metadata["general.architecture"] = "llama"
    assert tokenizer_from_gguf(metadata).chat_template.source == plain_chat_template().source


@pytest.mark.parametrize("writes_bos", [True, False])
def test_apply_chat_template_adds_bos_once(writes_bos: bool) -> None:
    metadata = sentencepiece_metadata(train_sentencepiece(add_dummy_prefix=False), False)
    metadata["tokenizer.chat_template"] = ("{{ bos_token }}" if writes_bos else "") + "{{ messages[0]['content'] }}"
    tok = tokenizer_from_gguf(metadata)
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}])
    assert ids == tok.encode("hello") and ids.count(tok.bos_id) == 1


def test_two_user_messages_in_a_row_are_joined_where_roles_must_alternate() -> None:
    """As after an answer that failed (the app leaves it out) or an API client's two user messages."""
    template = ChatTemplate(NO_SYSTEM_TEMPLATE, "<bos>")  # no system role, and roles must alternate
    messages = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi again"}]
    joined = "<bos><start_of_turn>user\n{}Hi\n\nHi again<end_of_turn>\n<start_of_turn>model\n"
    assert template.render(messages) == joined.format("")
    both = [{"role": "system", "content": "Be brief."}, *messages]
    assert template.render(both) == joined.format("Be brief.\n\n")
    # a template that takes them as they are keeps them apart
    assert ChatTemplate(CHATML_TEMPLATE).render(messages).count("<|im_start|>user") == 2


def test_a_blank_system_prompt_is_left_out_where_the_template_has_no_system_role() -> None:
    template = ChatTemplate(NO_SYSTEM_TEMPLATE, "<bos>")
    for blank in ("\n", "  ", ""):
        messages = [{"role": "system", "content": blank}, {"role": "user", "content": "Hi"}]
        assert template.render(messages) == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_a_system_prompt_the_template_rewrites_is_not_folded_into_the_user_turn() -> None:
    """SmolLM3's template takes its /no_think switch out of the system text; it still uses the rest."""
    rewrites = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'].replace('/no_think', '').strip() }}"
                "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    messages = [{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "Hi"}]
    assert ChatTemplate(rewrites).render(messages) == "<system>Be brief.<user>Hi<assistant>"
    drops = ("{% for m in messages %}{% if m['role'] != 'system' %}<{{ m['role'] }}>{{ m['content'] }}{% endif %}"
             "{% endfor %}")
    assert ChatTemplate(drops).render(messages, add_generation_prompt=False) == "<user>Be brief. /no_think\n\nHi"


def test_generation_tags_tojson_separators_and_absent_tools_render_as_transformers_does() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
        "{{ {'a': 1, 'b': [1, 2]} | tojson(separators=(',', ':')) }}"
        "{% if tools is not none %}TOOLS{% endif %}{% if documents is not none %}DOCS{% endif %}")
    assert template.render([{"role": "user", "content": "Hi"}]) == 'Hi{"a":1,"b":[1,2]}'
    assert "TOOLS" in template.render([{"role": "user", "content": "Hi"}], tools=[{"type": "function"}])
    with pytest.raises(TemplateError, match="separators"):
        ChatTemplate("{{ 1 | tojson(separators=(1, 2)) }}").render([])


def test_an_answer_whose_thought_the_template_drops_is_continued_as_a_prefill() -> None:
    """DeepSeek-R1's distills and QwQ show past answers without their thought, so the answer to continue is not in
    the rendered conversation: it goes after the generation prompt, sharing the "<think>\\n" that prompt opens."""
    r1 = ("{% for m in messages %}{% if m['role'] == 'user' %}<|User|>{{ m['content'] }}"
          "{% else %}<|Assistant|>{{ m['content'].split('</think>')[-1] }}<|end|>{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}")
    metadata = sentencepiece_metadata(train_sentencepiece(add_dummy_prefix=False), False)
    metadata["tokenizer.chat_template"] = r1
    tok = tokenizer_from_gguf(metadata)
    answer = "<think>\nLet me add.\n</think>\n\nThe answer is"
    ids = tok.apply_chat_template([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": answer}],
                                  continue_final=True)
    assert tok.decode(ids, skip_special=True).endswith("<|User|>2+2?<|Assistant|>" + answer)
    with pytest.raises(TemplateError, match="cannot be continued"):  # nothing before it to prefill after
        tok.apply_chat_template([{"role": "assistant", "content": answer}], continue_final=True)
