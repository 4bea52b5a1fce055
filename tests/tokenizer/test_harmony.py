"""gpt-oss's harmony answers at the text edge: channels shown as a thought and a reply however the text arrives, the
answer's end and tool calls stop it while a message's end does not, earlier answers go back without their thought."""
from __future__ import annotations

import pytest

from engine.tokenizer.harmony import HarmonyText, answer_markup, is_harmony, without_thought
from engine.tokenizer.stop_tokens import collect_stop_ids

ANSWER = ("<|channel|>analysis<|message|>The user greets. Reply warmly.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?")


def _stream(pieces: list[str]) -> str:
    h = HarmonyText()
    return "".join(h.feed(p) for p in pieces) + h.finish()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_channels_become_a_thought_and_a_reply_however_the_text_arrives(size):
    pieces = [ANSWER[i:i + size] for i in range(0, len(ANSWER), size)]
    assert _stream(pieces) == "<think>The user greets. Reply warmly.</think>Hello! How can I help?"


def test_text_is_released_as_it_streams_not_held_to_the_end():
    h = HarmonyText()
    assert h.feed("<|channel|>analysis<|message|>") == "<think>"
    assert h.feed("Think") == "Think"
    assert h.feed("ing <") == "ing "  # a tag may be starting: held
    assert h.feed("3") == "<3"
    assert h.feed("<|end|><|start|>assistant<|channel|>final") == "</think>"
    assert h.feed("<|message|>Hi") == "Hi"


def test_an_answer_cut_short_while_thinking_stays_an_open_thought():
    assert _stream(["<|channel|>analysis<|message|>Still going"]) == "<think>Still going"


def test_text_without_a_header_is_the_reply_and_other_channels_show_plainly():
    assert _stream(["Just text, no channel."]) == "Just text, no channel."
    assert _stream(["<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}"]) == "{}"


def test_the_answers_end_stops_and_a_messages_end_does_not():
    vocab = {"<|end|>": 5, "<|return|>": 6, "<|call|>": 7, "<|channel|>": 8, "<|message|>": 9, "<|endoftext|>": 10}
    stops = collect_stop_ids(vocab.get, 6, [], 20)
    assert stops == {6, 7, 10}
    assert is_harmony(vocab.get)
    phi3 = {"<|end|>": 5, "<|endoftext|>": 10}  # Phi-3's <|end|> ends its turn
    assert collect_stop_ids(phi3.get, 10, [], 20) == {5, 10} and not is_harmony(phi3.get)


def test_earlier_answers_go_back_without_their_thought():
    assert without_thought("<think>private\nplan</think>\n\nThe reply.") == "The reply."
    assert without_thought("No thought here.") == "No thought here."


@pytest.mark.parametrize("written", [ANSWER, "<|channel|>analysis<|message|>Cut while thinking",
                                     "<|channel|>final<|message|>A reply only"])
def test_an_answer_to_continue_goes_back_on_the_channels_it_came_on(written):
    """Continue writes the shown answer back as harmony markup (an open thought on the analysis channel, where the model
    goes on thinking), which streams to the same shown text."""
    shown = _stream([written])
    assert answer_markup(shown) == written and _stream([answer_markup(shown)]) == shown


@pytest.mark.parametrize("family, token", [("Command-R", "<|END_OF_TURN_TOKEN|>"), ("EXAONE", "[|endofturn|]"),
                                           ("Granite", "<|end_of_text|>")])
def test_a_familys_end_of_turn_stops_where_the_file_names_another_eos(family, token):
    vocab = {"<eos>": 1, token: 9}
    assert 9 in collect_stop_ids(vocab.get, 1, [], 20), family


TWO_THOUGHTS = ("<|channel|>analysis<|message|>First idea.<|end|><|start|>assistant<|channel|>analysis<|message|>"
                "Second idea.<|end|><|start|>assistant<|channel|>final<|message|>Done.")


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_analysis_messages_in_a_row_are_one_thought(size):
    """gpt-oss may think in several analysis messages: they read as one thought, not a second one in the reply."""
    pieces = [TWO_THOUGHTS[i:i + size] for i in range(0, len(TWO_THOUGHTS), size)]
    assert _stream(pieces) == "<think>First idea.\n\nSecond idea.</think>Done."


def test_reply_messages_are_paragraphs_and_thinking_after_the_reply_is_not_shown():
    preamble = ("<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking."
                "<|end|><|start|>assistant<|channel|>analysis<|message|>More plan.<|end|>"
                "<|start|>assistant<|channel|>final<|message|>The answer.")
    assert _stream([preamble]) == "<think>Plan.</think>Checking.\n\nThe answer."


def test_a_thought_whose_message_ended_closes_at_the_end():
    assert _stream(["<|channel|>analysis<|message|>Only this.<|end|>"]) == "<think>Only this.</think>"
