"""Sampling settings at their edges mean what the docs say, on every draw path (the CPU library's and torch's), and the
command line and the server read them alike."""
import pytest
import torch

from engine.sampling import SamplerState, SamplingParams, probabilities, sample_ids


@pytest.fixture(params=["library", "torch"])
def path(request, monkeypatch):
    """The CPU library's draw (where built), and torch's softmax, ranking and inverse CDF."""
    if request.param == "torch":
        for name in ("draw_rows", "sample_top", "top_rows"):
            monkeypatch.setattr(f"engine.sampling.{name}", lambda *args: None)
    return request.param


def _logits(vocab: int = 1000, top: int = 5) -> torch.Tensor:
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0)) * 3
    logits[0, top] = 20.0
    return logits


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 5e-324])
@pytest.mark.parametrize("filters", [{}, dict(top_k=5), dict(top_p=0.9), dict(min_p=0.1)])
def test_a_tiny_temperature_takes_the_argmax(path, temperature, filters):
    """logits / T overflowed: the library drew token 0, torch an id past the vocabulary (or failed on top-k)."""
    logits = _logits()
    state = SamplerState(SamplingParams(temperature=temperature, seed=1, **filters))
    ids = {int(sample_ids(logits.clone(), [state], [[]], positions=[p])[0]) for p in range(8)}
    assert ids == {5}


@pytest.mark.parametrize("name, value", [("temperature", 2.0000001), ("presence_penalty", -2.0000001),
                                         ("top_p", 1.0000001)])
def test_the_server_names_an_out_of_range_value_as_sent(name, value):
    """`:g` wrote 2.0000001 as "2": "'temperature' must be between 0 and 2, not 2." named an allowed value."""
    from server.protocol import APIError, sampling

    with pytest.raises(APIError, match=rf"not {value!r}\.$"):
        sampling({name: value}, 1024)


@pytest.mark.parametrize("flags, fields", [
    (["--top-k", "-1", "--temperature", "0.8"], dict(top_k=-1, temperature=0.8)),
    (["--seed", "-1", "--temperature", "0.8"], dict(seed=-1, temperature=0.8)),
    (["--top-p", "0", "--temperature", "0.8"], dict(top_p=0, temperature=0.8)),
    (["--min-p", "1", "--temperature", "0.8"], dict(min_p=1, temperature=0.8)),
])
def test_the_command_line_reads_a_setting_as_the_server_does(flags, fields):
    """The server (and the app's "random" seed) took -1 and top-p 0; `parley generate` refused them."""
    from cli.main import build_parser
    from cli.options import sampling_params
    from server.protocol import sampling

    args = build_parser().parse_args(["generate", "--prompt", "x", "--max-tokens", "8", "--repeat-last-n", "-1", *flags])
    assert sampling_params(args) == sampling(dict(fields, max_tokens=8), 1024)


def test_penalties_kept_off_the_prompt_read_the_answer_alone():
    """OpenAI counts presence / frequency over the answer's sampled tokens: a prompt token (a chat's end-of-turn
    token) is not penalised, the answer's own tokens are."""
    from engine.sequence import Sequence

    prompt, params = [5, 6, 7], SamplingParams(presence_penalty=100.0, penalize_prompt=False)
    seq = Sequence(0, list(prompt), SamplerState(params))
    logits = _logits(vocab=10, top=7)
    first = sample_ids(logits.clone(), [seq.sampler], [seq.penalty_history()], positions=[3])
    assert int(first[0]) == 7  # the prompt's 7 is not penalised
    seq.append(7)
    assert list(seq.penalty_history()) == [7]
    assert int(sample_ids(logits.clone(), [seq.sampler], [seq.penalty_history()], positions=[4])[0]) != 7
    whole = Sequence(1, list(prompt), SamplerState(SamplingParams(presence_penalty=100.0)))
    assert int(sample_ids(logits.clone(), [whole.sampler], [whole.penalty_history()], positions=[3])[0]) not in prompt


@pytest.mark.parametrize("body, reads_prompt", [
    ({"presence_penalty": 1.5}, False), ({"frequency_penalty": 0.5}, False),
    ({"presence_penalty": 1.5, "repeat_last_n": 64}, True), ({"repetition_penalty": 1.1}, True), ({}, True),
])
def test_the_server_keeps_openai_penalties_off_the_prompt(body, reads_prompt):
    """Qwen3's suggested presence_penalty 1.5 over the whole text weighed on its end-of-turn token, in every turn's
    prompt: answers ran on. As OpenAI and vLLM, presence / frequency count the answer's tokens; a window sent is
    llama.cpp's rule, over the whole text."""
    from server.protocol import sampling

    assert sampling(body, 4096).penalize_prompt is reads_prompt


@pytest.mark.parametrize("k, p, t", [(5, 0.5, 0.7), (20, 0.8, 1.5), (40, 0.95, 0.7), (100, 0.9, 1.0)])
def test_top_p_after_top_k_keeps_what_transformers_keeps(k, p, t):
    """Top-p counts mass within what top-k keeps, renormalised (llama.cpp's chain and transformers' processors);
    over the whole row's mass it kept every top-k token here (20 where transformers keeps 11)."""
    warpers = pytest.importorskip("transformers.generation.logits_process")
    logits = torch.randn(1, 5000, generator=torch.Generator().manual_seed(k)) * 3
    ours = probabilities(logits.clone(), [SamplerState(SamplingParams(temperature=t, top_k=k, top_p=p))])
    x = warpers.TemperatureLogitsWarper(t)(None, logits.clone())
    x = warpers.TopPLogitsWarper(p)(None, warpers.TopKLogitsWarper(k)(None, x))
    want = torch.softmax(x, dim=-1)
    assert torch.equal(ours > 0, want > 0) and torch.allclose(ours, want, atol=1e-6)
