"""Tool-call markers that a vocabulary types as control tokens stay in decoded text, as thought tags do: without them a
call reads as plain JSON content (Hermes 3 types its <tool_call> control)."""
from __future__ import annotations

from engine.tokenizer.from_gguf import tokenizer_from_gguf
from engine.tool_calls import parse_calls
from tests.support.gemma import byte_level_metadata

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def test_a_control_typed_call_marker_stays_in_the_text_and_the_call_is_read(trained_byte_level):
    meta = byte_level_metadata(trained_byte_level)
    for text in ("<tool_call>", "</tool_call>", "<|not_a_marker|>"):
        meta["tokenizer.ggml.tokens"].append(text)
        meta["tokenizer.ggml.token_type"].append(3)  # control, as a GGUF of Hermes 3 types it
    tok = tokenizer_from_gguf(meta)
    ids = tok.encode(f"<tool_call>\n{CALL}\n</tool_call><|not_a_marker|>", add_bos=False)
    assert tok.token_to_id("<tool_call>") in ids  # one token, as the model writes it
    shown = tok.decode(ids, skip_special=True)
    assert shown == f"<tool_call>\n{CALL}\n</tool_call>"  # other control tokens still go
    assert parse_calls("hermes", shown, ["get_weather"])[1][0].name == "get_weather"
    stream = tok.detokenizer()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == shown  # the streamed answer too
