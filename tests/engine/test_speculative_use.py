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
