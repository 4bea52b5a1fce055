"""`parley generate --suffix`: fill in the middle from the command line (the server's `suffix`), and the one line a
model that was not trained to do so gets."""
from __future__ import annotations

import json

import httpx
import pytest

from cli.main import main
from server.run import BackgroundServer
from tests.server.conftest import tiny_bridge
from tests.server.test_completion_fields import FIM, fim_gguf

PREFIX, SUFFIX = "def area(r):\n    return ", "\n\nprint(area(2))"


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    return fim_gguf(tmp_path_factory.mktemp("fim_cli"))


def _generate(model, data_dir, *extra: str) -> int:
    return main(["--data-dir", str(data_dir), "generate", "--model", str(model), "--max-tokens", "8",
                 "--speculative", "off", "--json", *extra])


def test_suffix_fills_the_middle_as_a_raw_prompt_with_the_markers_does(coder, tmp_path, capsys):
    """The document the server writes for `suffix`: the same tokens in and the same answer out as a raw prompt
    written with the markers by hand."""
    assert _generate(coder, tmp_path, "--prompt", PREFIX, "--suffix", SUFFIX) == 0
    filled = json.loads(capsys.readouterr().out.splitlines()[0])
    assert _generate(coder, tmp_path, "--raw", "--prompt", f"{FIM[0]}{PREFIX}{FIM[1]}{SUFFIX}{FIM[2]}") == 0
    by_hand = json.loads(capsys.readouterr().out.splitlines()[0])
    assert filled["token_ids"] == by_hand["token_ids"] and filled["prompt_tokens"] == by_hand["prompt_tokens"]
    assert _generate(coder, tmp_path, "--raw", "--prompt", PREFIX) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["prompt_tokens"] < filled["prompt_tokens"] - 3


def test_a_model_that_cannot_fill_in_the_middle_is_one_line(tiny_models, tmp_path, capsys):
    assert _generate(tiny_models["qwen3"].gguf_path, tmp_path, "--prompt", PREFIX, "--suffix", SUFFIX) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("parley: argument --suffix: qwen3 was not trained to fill in the middle (its vocabulary "
                                 "holds no fill-in-the-middle tokens); a code model that was does, e.g. Qwen2.5-Coder, "
                                 "StarCoder2, CodeLlama, DeepSeek-Coder or Codestral\n")


def test_suffix_sends_no_chat_template_so_thinking_is_refused(capsys):
    assert main(["generate", "--prompt", PREFIX, "--suffix", SUFFIX, "--thinking", "on"]) == 2
    assert "argument --thinking: it switches a chat template's thinking; --suffix sends the text without one" in \
        capsys.readouterr().err


def test_an_empty_suffix_asks_for_none_as_the_server_s_does(tiny_models, tmp_path, capsys):
    """`--suffix ""` on a model without fill-in-the-middle tokens was refused, where the server's `suffix: ""` is a
    plain completion: both now complete the prompt as a raw document."""
    model = tiny_models["qwen3"].gguf_path
    assert _generate(model, tmp_path, "--prompt", PREFIX, "--suffix", "") == 0
    empty = json.loads(capsys.readouterr().out.splitlines()[0])
    assert _generate(model, tmp_path, "--prompt", PREFIX, "--raw") == 0
    raw = json.loads(capsys.readouterr().out.splitlines()[0])
    assert empty["token_ids"] == raw["token_ids"] and empty["prompt_tokens"] == raw["prompt_tokens"]
    with tiny_bridge(tiny_models, 1) as bridge, BackgroundServer(bridge) as server:
        served = httpx.post(server.url + "/completions", timeout=60, json={
            "model": "tiny", "prompt": PREFIX, "suffix": "", "max_tokens": 8, "temperature": 0}).json()
    assert served["choices"][0]["text"] == empty["text"]
    assert served["usage"]["prompt_tokens"] == empty["prompt_tokens"]
