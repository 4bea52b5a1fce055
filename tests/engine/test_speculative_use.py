"""Speculative decoding as users ask for it: the options that choose a drafter, and what a turn reports."""
import argparse

import pytest
import torch
from safetensors.torch import save_file

from cli.options import add_engine_options, engine_config, paths_of
from engine.errors import ParleyError
from engine.speculative.dflash_net import FORMAT


def _config(*argv: str):
    p = argparse.ArgumentParser()
    add_engine_options(p)
    args = p.parse_args(list(argv))
    return engine_config(args, paths_of(args))


@pytest.fixture
def files(tmp_path):
    gguf = tmp_path / "small.gguf"
    gguf.write_bytes(b"GGUF")  # only its kind matters here: the engine reads it at load
    drafter = tmp_path / "drafter.safetensors"
    save_file({"w": torch.zeros(1)}, str(drafter), metadata={"format": FORMAT})
    return gguf, drafter


def test_a_draft_model_file_picks_its_mode_where_speculative_is_left_out_or_names_it(files):
    gguf, drafter = files
    assert _config("--draft-model", str(gguf)).speculative == "draft"
    assert _config("--speculative", "draft", "--draft-model", str(gguf)).speculative == "draft"
    assert _config("--draft-model", str(drafter)).speculative == "dflash"
    assert _config("--speculative", "dflash", "--draft-model", str(drafter)).speculative == "dflash"


@pytest.mark.parametrize("mode, file, words", [
    ("off", 0, "--speculative off does not go with --draft-model"),
    ("lookup", 0, "--speculative lookup does not go with --draft-model"),
    ("dflash", 0, "needs a DFlash drafter file"),
    ("draft", 1, "is a DFlash drafter: --speculative dflash"),
])
def test_a_mode_the_draft_model_file_cannot_serve_is_refused_in_one_line(files, mode, file, words):
    """--speculative off with --draft-model drafted with the model all the same (and dflash with a .gguf ran it as a
    draft model): the explicit choice was silently overridden."""
    with pytest.raises(ParleyError, match=words) as info:
        _config("--speculative", mode, "--draft-model", str(files[file]))
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def padded_pair(tmp_path_factory):
    """One tokenizer, two embedding sizes: the second model has 128 padding rows more (as Qwen2.5 14B+ against 7B and
    smaller: 152,064 and 151,936)."""
    import json

    from tests.support.tiny_models import make_tiny_hf

    root = tmp_path_factory.mktemp("padded")
    small = make_tiny_hf("llama", root / "small")
    vocab = json.loads((small / "config.json").read_text())["vocab_size"]
    return small, make_tiny_hf("llama", root / "padded", config={"vocab_size": vocab + 128})


def _answer(model, **config):
    from engine import events as ev
    from engine.runtime import EngineConfig
    from engine.sampling import SamplingParams
    from tests.support.engine_client import Client

    c = Client(EngineConfig(max_sessions=2, max_session_tokens=256, step_tokens=32, chunk_tokens=16, **config))
    with c.engine:
        model_id = c.load(model)
        info = c.wait_for(lambda e: isinstance(e, ev.ModelLoaded)).info
        sid = c.open(model_id, params=SamplingParams(max_tokens=40), raw=True)
        return info, c.ask(sid, "one two three four five six " * 3)


@pytest.mark.parametrize("order", ["padded target", "padded draft"])
def test_a_draft_model_whose_vocabulary_differs_by_padding_rows_drafts(padded_pair, order, caplog):
    """Such a pair was refused ("their tokenizers differ"), and drafts of the padded draft model's extra rows, or a
    padded target's tokens the draft model lacks, would fail the turn (an embedding index out of range)."""
    small, padded = padded_pair
    target, draft = (padded, small) if order == "padded target" else (small, padded)
    _, plain = _answer(target, speculative="off")
    info, drafted = _answer(target, speculative="draft", draft_model=draft)
    assert info["speculative"] == "draft" and not info["notices"]
    assert drafted.text == plain.text and drafted.stats.completion_tokens == plain.stats.completion_tokens
    assert drafted.stats.drafted_tokens > 0
    assert "draft model step failed" not in caplog.text  # it never ran a token it has no row for


def test_dflash_without_a_drafter_says_what_file_it_needs():
    """It read "needs a draft model (--draft-model PATH)": a smaller model, which dflash cannot use."""
    with pytest.raises(ParleyError, match="needs a DFlash drafter trained for the model") as info:
        _config("--speculative", "dflash")
    assert "training.dflash" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ParleyError, match="needs a draft model: a smaller model with the same tokenizer"):
        _config("--speculative", "draft")


def _drafted_answer(lm, prompt, answer, stop_ids=frozenset()):
    """A greedy answer with every step drafting the next 8 tokens of `answer` (all right): the sequence afterwards."""
    from bench.runs import RunConfig, make_batcher
    from engine.sampling import SamplerState, SamplingParams
    from engine.sequence import Sequence

    class Script:
        name, max_sequences = "script", 4

        def may_draft(self, seq):
            return True

        def propose(self, seqs, room):
            for seq, most in zip(seqs, room):
                done = len(seq.generated)
                seq.draft = answer[done : done + min(8, most)]

        def observe(self, seq, drafted, accepted):
            pass

    batcher = make_batcher(lm, 1, RunConfig(max_seq_len=160, step_tokens=24, chunk_tokens=8))
    batcher.drafter = Script()
    seq = Sequence(0, list(prompt), SamplerState(SamplingParams(max_tokens=24)), stop_ids)
    batcher.add(seq)
    while batcher.has_work():
        batcher.step()
    return seq


@pytest.fixture(scope="module")
def tiny_llama(padded_pair):
    from engine.loading.loader import load_model

    return load_model(padded_pair[0])


def test_accepted_tokens_count_only_drafts_the_answer_keeps(tiny_llama):
    """A stop token inside a verify step's accepted drafts ends the answer there; the drafts after it were counted
    as accepted all the same (accepted_tokens above completion_tokens - decode_steps)."""
    from bench.runs import RunConfig, make_batcher
    from engine.sampling import SamplingParams
    from tests.support.engine_helpers import run_staggered

    prompt = list(range(10, 31))
    plain = run_staggered(make_batcher(tiny_llama, 1, RunConfig(max_seq_len=160)), [prompt], [0],
                          SamplingParams(max_tokens=24))[0]
    whole = _drafted_answer(tiny_llama, prompt, plain)
    assert whole.generated == plain and whole.num_accepted == len(plain) - whole.num_steps
    stop = plain[5]
    cut = _drafted_answer(tiny_llama, prompt, plain, frozenset({stop}))
    assert cut.generated == plain[: plain.index(stop) + 1]
    # every token after the first step's came from a draft, the stop token too
    assert cut.num_accepted == len(cut.generated) - 1 and cut.num_accepted == sum(cut.from_draft)


def test_a_stop_string_inside_accepted_drafts_takes_them_out_of_the_count(padded_pair, tmp_path):
    """The model's own copy drafts (every draft kept); a stop string ends the answer inside a verify step's drafts,
    whose drafts past it were still counted as accepted (accepted_tokens 10 with 8 completion tokens)."""
    import shutil

    from engine.sampling import SamplingParams
    from tests.support.engine_client import Client
    from engine.runtime import EngineConfig

    target = padded_pair[0]
    draft = shutil.copytree(target, tmp_path / "copy")
    c = Client(EngineConfig(max_sessions=2, max_session_tokens=256, step_tokens=32, chunk_tokens=16,
                            speculative="draft", draft_model=draft))
    with c.engine:
        model = c.load(target)
        text = c.ask(c.open(model, params=SamplingParams(max_tokens=30), raw=True), "one two three").text
        for at in range(4, 24, 3):
            params = SamplingParams(max_tokens=30, stop=[text[at : at + 2]])
            end = c.ask(c.open(model, params=params, raw=True), "one two three")
            s = end.stats
            assert end.reason == "stop_string" and end.text == text[: text.index(text[at : at + 2])]
            # each step yields its own token after its drafts, but the last one, which a stop may cut short
            assert s.completion_tokens - s.decode_steps <= s.accepted_tokens <= s.completion_tokens - s.decode_steps + 1
