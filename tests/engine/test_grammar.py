"""Answers held to a grammar (engine/constraint): each token is masked to what the grammar allows, so even a model of
random weights answers with JSON that follows its schema; the token bytes llguidance matches are the tokenizer's;
batched equals alone, guided sequences verifying drafts too."""
from __future__ import annotations

import json
import random

import pytest
import torch

from bench.runs import RunConfig, make_batcher
from cli import main as cli
from engine import events as ev
from engine.constraint.grammar import (LARGEST, closed, json_grammar, lark_grammar, regex_grammar, schema_from_text,
                                      with_control_tokens)
from engine.constraint.guide import Grammars
from engine.constraint.token_bytes import grammar_tokenizer
from engine.errors import ParleyError
from engine.loading.loader import load_model
from engine.runtime import EngineConfig
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence
from engine.tokenizer import tokenizer_from_gguf
from engine.tokenizer.sentencepiece_backend import BYTE_PIECE
from tests.engine.test_speculative import ScriptedDrafter
from tests.support.engine_client import Client
from tests.support.engine_helpers import full_logits, staggered_sequences
from tests.support.gemma import sentencepiece_metadata, train_sentencepiece

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pet": {"enum": ["cat", "dog", "none"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "age", "pet", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def lm(tiny_models):
    return load_model(tiny_models["llama"].gguf_path)


@pytest.fixture(scope="module")
def grammars(lm):
    return Grammars(lm.tokenizer, lm.args.vocab_size)


def _run(lm, prompts: list[list[int]], params: list[SamplingParams], guides: list, run: RunConfig,
         arrivals: list[int] | None = None, drafter=None) -> list[Sequence]:
    batcher = make_batcher(lm, len(prompts), run)
    batcher.drafter = drafter
    return staggered_sequences(batcher, prompts, arrivals or [0] * len(prompts), params, lm.tokenizer.stop_ids, guides)


def _prompts(lm) -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(6, lm.args.vocab_size) for _ in range(n)] for n in (9, 17, 4)]


def _answer(lm, seq: Sequence) -> str:
    return lm.tokenizer.decode([t for t in seq.generated if t not in seq.stop_ids])


def _follows_schema(value: object) -> bool:
    return (isinstance(value, dict) and set(value) == set(SCHEMA["required"]) and isinstance(value["name"], str)
            and len(value["name"]) <= 12 and type(value["age"]) is int and 0 <= value["age"] <= 150
            and value["pet"] in ("cat", "dog", "none") and isinstance(value["tags"], list)
            and len(value["tags"]) <= 3 and all(isinstance(t, str) and len(t) <= 6 for t in value["tags"]))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_random_weights_answer_json_that_follows_the_schema(lm, grammars, temperature):
    grammar = json_grammar(SCHEMA)
    prompts = _prompts(lm)
    params = [SamplingParams(max_tokens=200, temperature=temperature, seed=i) for i in range(len(prompts))]
    seqs = _run(lm, prompts, params, [lambda: grammars.guide(grammar)] * 3, RunConfig(max_seq_len=256))
    for seq in seqs:
        assert seq.finish_reason == "stop", (seq.finish_reason, _answer(lm, seq))
        assert _follows_schema(json.loads(_answer(lm, seq))), _answer(lm, seq)
    free = _run(lm, prompts[:1], params[:1], [None], RunConfig(max_seq_len=256))[0]
    with pytest.raises(ValueError):  # the same model unguided writes no JSON: the mask made the difference
        json.loads(_answer(lm, free))


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_guided_and_free_sessions_verifying_drafts_batched_equal_alone(lm, grammars, layout):
    """Guided (greedy and sampled) and free sequences share steps, all verifying drafts kept whole, in part and not
    at all (a wrong draft is mostly one the grammar refuses, so rows after it are past a refused token); each one's
    tokens are those it makes alone without drafts: a guided draft row is masked as its position would be."""
    grammar = json_grammar(SCHEMA)
    prompts = _prompts(lm)
    params = [SamplingParams(max_tokens=60), SamplingParams(max_tokens=40),
              SamplingParams(max_tokens=60, temperature=1.0, seed=7)]
    guides = [lambda: grammars.guide(grammar), None, lambda: grammars.guide(grammar)]
    run = RunConfig(kv_layout=layout, max_seq_len=128, step_tokens=24, chunk_tokens=8)
    alone = [_run(lm, [p], [q], [g], run)[0].generated for p, q, g in zip(prompts, params, guides)]
    drafter = ScriptedDrafter({i: a for i, a in enumerate(alone)}, wrong=3, vocab=lm.args.vocab_size)
    seqs = _run(lm, prompts, params, guides, run, arrivals=[0, 1, 2], drafter=drafter)
    assert [s.generated for s in seqs] == alone
    assert all(s.num_drafted > s.num_accepted > 0 for s in seqs), [(s.num_drafted, s.num_accepted) for s in seqs]


def test_regex_grammar_allows_only_its_words(lm, grammars):
    grammar = regex_grammar(r"(yes|no|maybe)")
    params = [SamplingParams(max_tokens=20, temperature=1.0, seed=s) for s in range(3)]
    seqs = _run(lm, _prompts(lm), params, [lambda: grammars.guide(grammar)] * 3, RunConfig(max_seq_len=128))
    assert all(_answer(lm, s) in ("yes", "no", "maybe") and s.finish_reason == "stop" for s in seqs)


@pytest.mark.parametrize("schema,message", [
    ({"type": "nonsense"}, "Invalid JSON schema: Invalid type"),
    ({"$ref": "#/nowhere"}, "Invalid JSON schema:"),
    ({"type": "string", "pattern": "("}, "unclosed group"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_schemas_are_refused_with_a_reason(schema, message):
    with pytest.raises(ParleyError, match=message.replace("$", r"\$")):
        json_grammar(schema)


def test_schema_text_errors_name_the_place():
    with pytest.raises(ParleyError, match="line 1 column"):
        schema_from_text('{"type": ')
    with pytest.raises(ParleyError, match="must be a JSON object"):
        schema_from_text("[1]")


def test_a_users_grammar_may_not_name_its_rules_as_control_tokens():
    """A tool call's markers are rules named control_token_<k>, which the guide turns into the model's one token of
    their text: a user's rule of that name would be turned too (its text then allowed only as that token), so the name
    is refused; a JSON schema's names stay inside its JSON and never collide."""
    for source in ('start: control_token_0\ncontrol_token_0: "hello"', 'start: "a"\n?control_token_12_until_x: "b"'):
        with pytest.raises(ParleyError, match=r"the rule name 'control_token_\d+\w*' is reserved"):
            lark_grammar(source)
    assert lark_grammar('start: my_control_token_0\nmy_control_token_0: "hello"')  # only the reserved names
    schema = {"title": "control_token_0", "$defs": {"control_token_0": {"type": "string"}},
              "$ref": "#/$defs/control_token_0"}
    assert with_control_tokens(json_grammar(schema), lambda text: 5) == json_grammar(schema)


def test_grammar_params_are_checked():
    with pytest.raises(ParleyError, match="grammar must be text"):
        SamplingParams(grammar=3)
    with pytest.raises(ParleyError, match="a grammar must hold 1"):
        SamplingParams(grammar="")


def _plain_ids(tok) -> list[int]:
    """Ids of text pieces: no control tokens, no byte pieces, none holding byte 0xFF (written "ÿ" by byte-level BPE),
    which is never in UTF-8 text and is llguidance's mark of a control token."""
    return [i for i in range(tok.vocab_size) if i not in tok.backend.special_ids
            and not BYTE_PIECE.fullmatch(tok.id_to_token(i) or "") and "ÿ" not in (tok.id_to_token(i) or "")]


@pytest.mark.parametrize("kind", ["sentencepiece", "byte_level_bpe"])
def test_grammar_tokens_are_the_tokenizers_bytes(lm, kind):
    """Any run of tokens spells, in the bytes the grammar reads, exactly the UTF-8 of the tokenizer's decode: a
    grammar that allows some text allows every tokenisation the model may use for it."""
    if kind == "sentencepiece":
        sp = train_sentencepiece(add_dummy_prefix=True)
        tok = tokenizer_from_gguf(sentencepiece_metadata(sp, add_space_prefix=True))
    else:
        tok = lm.tokenizer
    llt = grammar_tokenizer(tok, tok.vocab_size)
    rng, plain = random.Random(7), _plain_ids(tok)
    # a first token without a leading space: decode drops no dummy prefix
    anchor = next(i for i in plain if not tok.decode([i]).startswith(" ") and tok.decode([i]).isalpha())
    for _ in range(300):
        ids = [anchor] + [rng.choice(plain) for _ in range(rng.randrange(1, 12))]
        # a byte-level token may hold part of a character: both sides replace what is not whole UTF-8 alike
        assert llt.decode_bytes(ids).decode("utf-8", "replace") == tok.decode(ids), ids
    for i in range(tok.vocab_size):
        byte = BYTE_PIECE.fullmatch(tok.id_to_token(i) or "")
        if byte and i not in tok.backend.special_ids and int(byte.group(1), 16) != 0xFF:  # 0xFF: llguidance's mark
            assert llt.decode_bytes([i]) == bytes([int(byte.group(1), 16)])
    assert all(llt.is_special_token(i) for i in tok.backend.special_ids)


def test_engine_turns_with_a_grammar_and_a_bad_one(tiny_models):
    """Through the engine thread with look-ahead on: a guided turn answers JSON beside a free one, a grammar that
    does not compile fails its turn alone with llguidance's reason, and the session answers its next turn."""
    client = Client(EngineConfig(max_sessions=3, max_session_tokens=256, step_tokens=32, chunk_tokens=16,
                                 lookahead=True))
    client.engine.start()
    try:
        model = client.load(tiny_models["qwen3"].gguf_path)
        guided = client.open(model, params=SamplingParams(max_tokens=150, grammar=json_grammar(SCHEMA)))
        free = client.open(model, params=SamplingParams(max_tokens=30))
        turns = [client.send(guided, "a person"), client.send(free, "hello")]
        ends = [client.wait(t) for t in turns]
        assert all(isinstance(e, ev.Finished) for e in ends), ends
        assert _follows_schema(json.loads(ends[0].text)), ends[0].text
        bad = client.open(model, params=SamplingParams(max_tokens=5, grammar='{"grammars": [{"lark_grammar": "x"}]}'))
        failed = client.wait(client.send(bad, "hi"))
        assert isinstance(failed, ev.Error) and "Invalid grammar" in failed.message, failed
        client.chats[bad].params = SamplingParams(max_tokens=5)
        client.ask(bad, "again")
    finally:
        client.engine.shutdown()


def test_log_probabilities_of_a_guided_answer_are_the_models_own(lm, grammars):
    """The mask changes what is drawn, not the numbers reported: each is the raw log-softmax at its position."""
    prompt = _prompts(lm)[0]
    params = SamplingParams(max_tokens=12, logprobs=2)
    batcher = make_batcher(lm, 1, RunConfig(max_seq_len=64))
    seq = Sequence(0, list(prompt), SamplerState(params), stop_ids=lm.tokenizer.stop_ids)
    seq.guide = grammars.guide(json_grammar(SCHEMA))
    batcher.add(seq)
    found = []
    while batcher.has_work():
        batcher.step()
        found += seq.step_logprobs
    want = torch.log_softmax(full_logits(lm, prompt + seq.generated[:-1]).double(), dim=-1)[len(prompt) - 1 :]
    assert [lp.token for lp in found] == seq.generated
    assert all(abs(lp.logprob - row[lp.token].item()) < 1e-4 for lp, row in zip(found, want))
    assert any(lp.top[0][0] != lp.token for lp in found)  # the model's favourite, outside the grammar, still ranked


def test_objects_that_list_properties_take_no_others_unless_they_say_so():
    schema = {"type": "object", "properties": {
        "properties": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "items": {"type": "array", "items": {"type": "object", "properties": {"b": {"type": "string"}}}},
        "open": {"type": "object", "properties": {"c": {"type": "string"}}, "additionalProperties": True},
        "any": {"type": "object"}}, "$defs": {"d": {"properties": {"e": {"const": {"properties": {}}}}}}}
    got = closed(schema)
    assert got["additionalProperties"] is False and set(got["properties"]) == {"properties", "items", "open", "any"}
    assert got["properties"]["properties"]["additionalProperties"] is False
    assert got["properties"]["items"]["items"]["additionalProperties"] is False
    assert got["properties"]["open"]["additionalProperties"] is True and "additionalProperties" not in got["properties"]["any"]
    assert got["$defs"]["d"]["additionalProperties"] is False
    assert got["$defs"]["d"]["properties"]["e"] == {"const": {"properties": {}}}  # values are not schemas
    assert "additionalProperties" not in schema  # a copy


def test_numbers_without_bounds_get_fifteen_digits(grammars):
    got = closed({"type": "object", "properties": {"n": {"type": "number"}, "i": {"type": "integer", "minimum": 3},
                                                   "x": {"type": "number", "exclusiveMaximum": 2}}})["properties"]
    assert (got["n"]["minimum"], got["n"]["maximum"]) == (-LARGEST, LARGEST)
    assert (got["i"]["minimum"], got["i"]["maximum"]) == (3, LARGEST) and "maximum" not in got["x"]
    guide = grammars.guide(json_grammar({"type": "object", "properties": {"n": {"type": "integer"}}}))
    ids = grammars._tokenizer.encode('{"n": ' + "1" * 16, add_bos=False)
    for token in ids:
        guide.advance(token)
    assert guide.error is not None  # a 16th digit breaks the grammar


def test_generate_holds_each_answer_to_a_schema_file(tiny_models, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    model = str(tiny_models["qwen3"].gguf_path)
    argv = ["generate", "--data-dir", str(tmp_path), "--model", model, "--max-tokens", "150", "--json"]
    assert cli.main([*argv, "--json-schema", str(schema), "--prompt", "one", "--prompt", "two"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"prompt"')]
    assert len(lines) == 2 and all(_follows_schema(json.loads(line["text"])) for line in lines), lines
    for flags, says in [(["--json-schema", str(tmp_path / "none.json")], "argument --json-schema: cannot read"),
                        (["--json-schema", model], "argument --json-schema: cannot read"),
                        (["--grammar", str(schema)], "argument --grammar: Invalid grammar")]:
        assert cli.main([*argv, *flags, "--prompt", "x"]) == 2
        assert says in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (decode graphs)")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_on_cuda_guided_rows_mask_on_the_device_beside_graph_steps(tiny_models, temperature):
    """On CUDA the masks are unpacked on the device, guided rows leave the step's graph argmax and sampling graphs
    for the eager path, and free rows in the same steps keep theirs: the JSON follows the schema, and each sequence
    batched equals itself alone."""
    from engine.loading.loader import LoadOptions

    lm = load_model(tiny_models["llama"].gguf_path, LoadOptions(device="cuda", dtype="bfloat16"))
    grammars = Grammars(lm.tokenizer, lm.args.vocab_size)
    grammar = json_grammar(SCHEMA)
    prompts = _prompts(lm)
    params = [SamplingParams(max_tokens=150, temperature=temperature, seed=i) for i in range(3)]
    guides = [lambda: grammars.guide(grammar), None, lambda: grammars.guide(grammar)]
    run = RunConfig(max_seq_len=256)
    alone = [_run(lm, [p], [q], [g], run)[0].generated for p, q, g in zip(prompts, params, guides)]
    seqs = _run(lm, prompts, params, guides, run, arrivals=[0, 1, 2])
    assert [s.generated for s in seqs] == alone
    for seq in (seqs[0], seqs[2]):
        assert seq.finish_reason == "stop" and _follows_schema(json.loads(_answer(lm, seq))), _answer(lm, seq)
