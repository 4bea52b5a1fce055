"""Reasoning models end to end at the engine's text edge: an answer cut while thinking continues from the prompt the
model wrote it after, whatever the template does with an unclosed thought."""
from __future__ import annotations

import pytest

from engine.tokenizer import tokenizer_from_gguf
from tests.support.gemma import CHATML_TEMPLATE, byte_level_metadata

# Written here in the shape of Qwen3's template: an answer's thought is split off at `</think>`; the last answer is
# shown with a thought block (an empty one where its text has no closed thought), earlier ones without.
QWEN3_SHAPE = (
    "{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% set c = m.content %}{% set r = '' %}"
    "{% if '</think>' in c %}{% set r = c.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{% set c = c.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{% if loop.last %}{{ '<|im_start|>assistant\\n<think>\\n' + r + '\\n</think>\\n\\n' + c + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>assistant\\n' + c + '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# In the shape of DeepSeek-R1's distills': the generation prompt opens the thought; answers are shown without theirs.
R1_SHAPE = (
    "{% for m in messages %}{% if m.role == 'assistant' %}{% set c = m.content %}"
    "{% if '</think>' in c %}{% set c = c.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>assistant\\n' + c + '<|im_end|>' }}"
    "{% else %}{{ '<|im_start|>user\\n' + m.content + '<|im_end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}")


def _continued(backend, template: str, answer: str) -> str:
    tok = tokenizer_from_gguf(byte_level_metadata(backend, "qwen2", **{"tokenizer.chat_template": template}))
    ids = tok.apply_chat_template([{"role": "user", "content": "Why?"}, {"role": "assistant", "content": answer}],
                                  continue_final=True)
    return tok.decode(ids)


@pytest.mark.parametrize("template, answer, prompt", [
    (QWEN3_SHAPE, "<think>\nLet me see", "<|im_start|>assistant\n<think>\nLet me see"),  # not after an empty thought
    (R1_SHAPE, "Let me see", "<|im_start|>assistant\n<think>\nLet me see"),  # the prompt's <think> kept
    (R1_SHAPE, "<think>\nLet me see", "<|im_start|>assistant\n<think>\nLet me see"),
    (CHATML_TEMPLATE, "<think>\nLet me see", "<|im_start|>assistant\n<think>\nLet me see"),
])
def test_an_answer_cut_while_thinking_continues_inside_its_thought(trained_byte_level, template, answer, prompt):
    assert _continued(trained_byte_level, template, answer).partition("Why?<|im_end|>")[2].lstrip("\n") == prompt


@pytest.mark.parametrize("template, answer, tail", [
    (QWEN3_SHAPE, "<think>\nPlan.\n</think>\n\nThe ans", "assistant\n<think>\nPlan.\n</think>\n\nThe ans"),
    (R1_SHAPE, "Plan.\n</think>\n\nThe ans", "assistant\n<think>\nPlan.\n</think>\n\nThe ans"),
    (CHATML_TEMPLATE, "Hello the", "assistant\nHello the"),
])
def test_an_answer_past_its_thought_continues_as_before(trained_byte_level, template, answer, tail):
    assert _continued(trained_byte_level, template, answer).endswith(tail)


@pytest.fixture
def client(tiny_models):
    from engine.runtime import EngineConfig
    from tests.support.engine_client import Client

    c = Client(EngineConfig(max_sessions=2, max_session_tokens=256, step_tokens=32, chunk_tokens=16))
    c.engine.start()
    c.model = c.load(tiny_models["qwen3"].gguf_path)
    yield c
    c.engine.shutdown()


def _use_template(client, template: str) -> None:
    from engine.tokenizer.chat_template import ChatTemplate

    client.engine._hosts[client.model].runtime.lm.tokenizer.chat_template = ChatTemplate(template)


def test_a_thought_the_prompt_opened_streams_as_a_thought(client):
    """An R1 distill's generation prompt opens `<think>`: the answer's text starts inside it, so the app shows it under
    "Thinking…" (not as the reply), and Continue and the next turn read it as the thought it is."""
    from engine import events as ev
    from engine.sampling import SamplingParams

    _use_template(client, R1_SHAPE)
    sid = client.open(client.model, params=SamplingParams(max_tokens=5))
    first = client.ask(sid, "Why?")
    turn = max(client.by_turn)
    assert first.text.startswith("<think>\n") and client.text(turn) == first.text
    more = client.continue_answer(sid)
    end = client.wait(more)
    assert isinstance(end, ev.Finished) and end.text == first.text + client.text(more)
    assert end.text.count("<think>") == 1  # the continued text does not open the thought again


def test_a_prompt_that_opens_no_thought_adds_nothing(client):
    from engine.sampling import SamplingParams

    _use_template(client, QWEN3_SHAPE)
    sid = client.open(client.model, params=SamplingParams(max_tokens=5))
    raw = client.open(client.model, params=SamplingParams(max_tokens=5), raw=True)
    assert not client.ask(sid, "Why?").text.startswith("<think>")
    assert not client.ask(raw, "So <think>\n").text.startswith("<think>")  # a raw document is the user's text


def test_seed_oss_thoughts_are_kept_in_streamed_text_and_split(trained_byte_level):
    """Seed-OSS thinks in `<seed:think>…</seed:think>`, tokens its vocabulary types control: they stay in the streamed
    text (skipping them ran the thought into the reply), and the app and the server split the thought off."""
    from app.core.reasoning import Reasoning, split_reasoning
    from server.protocol import split_answer

    metadata = byte_level_metadata(trained_byte_level, "qwen2")
    metadata["tokenizer.ggml.tokens"] += ["<seed:think>", "</seed:think>"]
    metadata["tokenizer.ggml.token_type"] += [3, 3]
    tok = tokenizer_from_gguf(metadata)
    ids = [tok.token_to_id("<seed:think>"), *tok.encode("hmm, a cat"), tok.token_to_id("</seed:think>"),
           *tok.encode("The cat."), tok.eos_id]
    stream = tok.detokenizer()
    text = "".join(stream.push(i) for i in ids) + stream.flush()
    assert text == "<seed:think>hmm, a cat</seed:think>The cat."
    assert split_reasoning(text) == Reasoning("hmm, a cat", "The cat.", False)
    assert split_answer(text) == {"content": "The cat.", "reasoning_content": "hmm, a cat"}


# In the shape of Seed-OSS's template: `thinking_budget` 0 asks for no thinking, and its generation prompt then opens
# the thought with a budget note (`<seed:cot_budget_reflect>`, a control token) that the model closes.
SEED_SHAPE = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if thinking_budget is defined and thinking_budget == 0 %}{{ '<seed:think><seed:cot_budget_reflect>' }}"
    "{% endif %}{% endif %}")


@pytest.mark.parametrize("thinking, opened", [(None, ""), (True, ""), (False, "<seed:think>")])
def test_seed_oss_thinking_off_is_a_budget_of_zero(trained_byte_level, thinking, opened):
    from app.core.reasoning import split_reasoning

    metadata = byte_level_metadata(trained_byte_level, "qwen2", **{"tokenizer.chat_template": SEED_SHAPE})
    metadata["tokenizer.ggml.tokens"] += ["<seed:think>", "</seed:think>", "<seed:cot_budget_reflect>"]
    metadata["tokenizer.ggml.token_type"] += [3, 3, 3]
    tok = tokenizer_from_gguf(metadata)
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], thinking=thinking)
    assert tok.opened_thought(ids) == opened
    if opened:  # the model's budget note, then its reply: the note folds as the thought
        text = opened + "Budget 0: answering directly.</seed:think>Hello."
        assert split_reasoning(text).reply == "Hello."
    assert split_reasoning("Budget 0.</seed:think>Hello.").reply == "Hello."  # an answer from before the tag was kept


GRANITE_SHAPE = ("{% if thinking %}{{ 'Think first.' }}{% endif %}"
                 "{% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}")


@pytest.mark.parametrize("thinking, asked", [(None, False), (True, True), (False, False)])
def test_granite_thinking_reads_the_switch_and_its_response_tags_fold(trained_byte_level, thinking, asked):
    """Granite 3.2+ templates read `thinking` (llama.cpp passes the switch so) and answer `<think>…</think>` then
    `<response>…</response>`: the reply is what the response holds."""
    from app.core.reasoning import Reasoning, split_reasoning

    tok = tokenizer_from_gguf(byte_level_metadata(trained_byte_level, "qwen2",
                                                  **{"tokenizer.chat_template": GRANITE_SHAPE}))
    prompt = tok.decode(tok.apply_chat_template([{"role": "user", "content": "Hi"}], thinking=thinking))
    assert prompt.startswith("Think first.") == asked
    answer = "<think>The user greets.</think>\n<response>Hello!</response>\n"
    assert split_reasoning(answer) == Reasoning("The user greets.", "Hello!", False)
    assert split_reasoning(answer[:-12]).reply == "Hello!"  # still streaming
