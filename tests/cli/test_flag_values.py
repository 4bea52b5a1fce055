"""Flag values that were taken and then went wrong, or were refused in the engine's or the server's own words."""
from __future__ import annotations

import argparse

import pytest

from cli.main import main
from cli.options import add_engine_options, engine_config, paths_of
from engine.errors import ParleyError


def test_a_draft_model_that_is_not_there_is_refused_before_the_load(tmp_path, monkeypatch):
    """`--draft-model ~/smal.gguf` (a typo) loaded the model, said 'The draft model could not be loaded (Model not
    found: …); drafting from the prompt instead.' and answered, exit 0."""
    monkeypatch.setenv("PARLEY_HOME", str(tmp_path))
    p = argparse.ArgumentParser()
    add_engine_options(p)
    args = p.parse_args(["--draft-model", str(tmp_path / "smal.gguf")])
    with pytest.raises(ParleyError, match=r"^argument --draft-model: no file or folder .*smal\.gguf$"):
        engine_config(args, paths_of(args))


@pytest.mark.parametrize("value", ["0.0001", "0.0009"])
def test_a_body_limit_under_a_kilobyte_is_refused_as_a_flag(capsys, value):
    """It passed the flag's check and was refused by the server's: 'parley: max_body_bytes must be at least 1024, not
    104' (a field the user never typed, in bytes)."""
    with pytest.raises(SystemExit) as stop:
        main(["serve", "--max-body-mb", value])
    assert stop.value.code == 2
    assert f"argument --max-body-mb: a size in MB of at least 0.001 (1 KB), not '{value}'" in capsys.readouterr().err
