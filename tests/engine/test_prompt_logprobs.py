"""Prompt log-probabilities (engine/prompt_logprobs.py): each prompt token's, given those before it, from the prefill
step that runs its position: transformers' log-softmax, the same in chunks, batched and alone, and never read from a
cached prefix."""
from __future__ import annotations

import pytest
import torch

from bench.runs import RunConfig, make_batcher
from engine import events as ev
from engine import prompt_logprobs
from engine.errors import ParleyError
from engine.loading.loader import load_model
from engine.logprobs import MAX_TOP, TokenLogprob
from engine.runtime import EngineConfig
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence
from tests.support.engine_client import Client, started_client
from tests.support.engine_helpers import full_logits, staggered_sequences
from tests.support.tiny_models import load_hf_reference

ARCHS = ["llama", "gemma3", "qwen3"]


@pytest.fixture(scope="module")
def models(tiny_models):
    return {arch: load_model(tiny_models[arch].hf_dir) for arch in ARCHS}


def _prompt(vocab: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(6, vocab, (n,), generator=g).tolist()


def _run(lm, prompts: list[list[int]], params: list[SamplingParams], run: RunConfig,
         arrivals: list[int] | None = None) -> list[Sequence]:
    """The prompts through one batcher, prompt i arriving at step arrivals[i], to their ends."""
    return staggered_sequences(make_batcher(lm, len(prompts), run), prompts, arrivals or [0] * len(prompts), params)


@pytest.mark.parametrize("arch", ARCHS)
def test_each_prompt_token_is_transformers_log_softmax(models, tiny_models, arch, monkeypatch):
    """Over several prefill chunks (8 tokens a step) and head chunks (3 rows: the logits are never whole)."""
    lm = models[arch]
    monkeypatch.setattr(prompt_logprobs, "CHUNK_ELEMENTS", 3 * lm.args.vocab_size)
    prompt = _prompt(lm.args.vocab_size, 29, 1)
    (seq,) = _run(lm, [prompt], [SamplingParams(max_tokens=1, prompt_logprobs=5)],
                  RunConfig(max_seq_len=64, step_tokens=8, chunk_tokens=8))
    with torch.no_grad():
        logits = load_hf_reference(tiny_models[arch].hf_dir)(torch.tensor([prompt])).logits[0]
    want = torch.log_softmax(logits.double(), dim=-1)[:-1]  # row i scores token i + 1
    got = seq.prompt_logprobs
    assert [lp.token for lp in got] == prompt[1:]
    for row, lp in zip(want, got):
        assert abs(lp.logprob - row[lp.token].item()) < 1e-4
        values, ids = row.topk(5)
        assert [t for t, _ in lp.top] == ids.tolist()
        assert max(abs(v - w) for (_, v), w in zip(lp.top, values.tolist())) < 1e-4


def test_a_quantized_head_scores_as_its_own_logits(tiny_models_q4, monkeypatch):
    """Q4_0 weights (the head's rows decoded by the int4 path, a chunk at a time): each entry is the log-softmax of
    the logits the model gives that position."""
    lm = load_model(tiny_models_q4["llama"].gguf_path)
    monkeypatch.setattr(prompt_logprobs, "CHUNK_ELEMENTS", 5 * lm.args.vocab_size)
    prompt = _prompt(lm.args.vocab_size, 21, 7)
    (seq,) = _run(lm, [prompt], [SamplingParams(max_tokens=1, prompt_logprobs=1)], RunConfig(max_seq_len=64))
    want = torch.log_softmax(full_logits(lm, prompt).double(), dim=-1)[:-1]
    assert [lp.token for lp in seq.prompt_logprobs] == prompt[1:]
    assert max(abs(lp.logprob - row[lp.token].item()) for lp, row in zip(seq.prompt_logprobs, want)) < 1e-4
    assert [lp.top[0][0] for lp in seq.prompt_logprobs] == want.argmax(-1).tolist()


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_batched_with_others_equals_alone(models, layout):
    """A prompt scored while others prefill and decode beside it (arriving mid-prefill, chunked by the shared step
    budget) gets the numbers it gets alone, and the others' tokens are those they make alone."""
    lm = models["llama"]
    vocab = lm.args.vocab_size
    prompts = [_prompt(vocab, 37, 2), _prompt(vocab, 11, 3), _prompt(vocab, 23, 4)]
    params = [SamplingParams(max_tokens=6, prompt_logprobs=3, logprobs=2), SamplingParams(max_tokens=9),
              SamplingParams(max_tokens=5, temperature=0.8, seed=5)]
    run = RunConfig(kv_layout=layout, max_seq_len=64, step_tokens=16, chunk_tokens=8)
    alone = [_run(lm, [p], [q], run)[0] for p, q in zip(prompts, params)]
    batched = _run(lm, prompts, params, run, arrivals=[0, 1, 2])
    assert [s.generated for s in batched] == [s.generated for s in alone]
    got, want = batched[0].prompt_logprobs, alone[0].prompt_logprobs
    assert len(got) == len(prompts[0]) - 1 and len(got) == len(want)
    assert all(_same(a, b) for a, b in zip(got, want))
    assert batched[1].prompt_logprobs == [] and batched[2].prompt_logprobs == []  # not asked: none computed


def _same(a: TokenLogprob, b: TokenLogprob) -> bool:
    """The same token and ranking, the numbers within float32 rounding (a step's rows change a product's last bit)."""
    close = abs(a.logprob - b.logprob) < 1e-5 and all(abs(x[1] - y[1]) < 1e-5 for x, y in zip(a.top, b.top))
    return close and a.token == b.token and [t for t, _ in a.top] == [t for t, _ in b.top]


def test_a_step_without_a_request_taps_nothing(models):
    lm = models["llama"]
    batcher = make_batcher(lm, 1, RunConfig(max_seq_len=64))
    lm.model.last_taps = None
    batcher.add(Sequence(0, _prompt(lm.args.vocab_size, 12, 6), SamplerState(SamplingParams(max_tokens=2))))
    while batcher.has_work():
        batcher.step()
    assert lm.model.last_taps is None and lm.model.tap_layers == ()


@pytest.mark.parametrize("bad", [-1, MAX_TOP + 1, True, 2.0])
def test_a_count_out_of_range_or_not_an_integer_is_refused(bad):
    with pytest.raises(ParleyError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)


@pytest.fixture
def client(tiny_models):
    config = EngineConfig(max_sessions=4, max_session_tokens=256, step_tokens=32, chunk_tokens=16)
    with started_client(config, tiny_models["qwen3"].gguf_path) as c:
        yield c


def _scored(client: Client, sid: int, text: str) -> tuple[list, ev.Finished]:
    """A turn's prompt entries (on its first delta) and its end."""
    turn = client.send(sid, text)
    end = client.wait(turn)
    deltas = [e for e in client.by_turn[turn] if isinstance(e, ev.TokenDelta)]
    assert all(d.prompt_logprobs is None for d in deltas[1:])
    return deltas[0].prompt_logprobs, end


def test_a_cached_prefix_is_run_again_to_be_scored(client):
    """A session whose cache holds the prompt (its last turn), and another whose prompt a parked slot holds, prefill
    the whole prompt: the entries cover every token after the first and equal a fresh session's."""
    text = "The quick brown fox jumps over the lazy dog, and then it runs away."
    scored = SamplingParams(max_tokens=1, prompt_logprobs=2)
    sid = client.open(client.model, params=scored)
    fresh, end = _scored(client, sid, text)
    assert end.stats.prefilled_tokens == end.stats.prompt_tokens
    assert len(fresh) == end.stats.prompt_tokens and all(isinstance(e.token, str) for e in fresh)
    assert fresh[0].logprob is None and fresh[0].top == () and all(e.logprob < 0 for e in fresh[1:])
    longer, end = _scored(client, sid, "And again?")  # its own cache holds the first turn
    assert end.stats.prefilled_tokens == end.stats.prompt_tokens and len(longer) == end.stats.prompt_tokens

    warm = client.open(client.model, params=SamplingParams(max_tokens=1))
    client.ask(warm, text)  # its slot holds the prompt now
    again, end = _scored(client, client.open(client.model, params=scored), text)  # another session: could copy it
    assert end.stats.prefilled_tokens == end.stats.prompt_tokens and again == fresh
    client.close(warm)  # parked: a later session could start from it
    again, end = _scored(client, client.open(client.model, params=scored), text)
    assert end.stats.prefilled_tokens == end.stats.prompt_tokens and again == fresh


def test_a_prompt_sent_twice_at_once_is_scored_twice(client):
    """Two sessions sent one prompt together: the second does not wait to copy the first's prefix (it would lack
    its rows), and both get every entry."""
    text = "A long prompt that two sessions send at the same time, word for word, to be scored. " * 2
    scored = SamplingParams(max_tokens=1, prompt_logprobs=0)
    sids = [client.open(client.model, params=scored) for _ in range(2)]
    turns = [client.send(sid, text) for sid in sids]
    ends = [client.wait(t) for t in turns]
    firsts = [next(e for e in client.by_turn[t] if isinstance(e, ev.TokenDelta)) for t in turns]
    assert [e.stats.prefilled_tokens for e in ends] == [e.stats.prompt_tokens for e in ends]
    assert len(firsts[0].prompt_logprobs) == ends[0].stats.prompt_tokens
    assert firsts[0].prompt_logprobs == firsts[1].prompt_logprobs


def test_a_scored_prompt_beside_a_dflash_drafter(tiny_models_q4):
    """The drafter reads its own tap layers of the step (the scoring's last layer is taken back out): the others'
    greedy tokens are those of a run without the scored prompt, and its numbers those it gets alone."""
    from tests.engine.test_dflash import _net, _prompts, _runtime

    lm = load_model(tiny_models_q4["llama"].gguf_path)
    prompts, net = _prompts(lm.args.vocab_size), _net(lm)
    scored = _prompt(lm.args.vocab_size, 30, 8)
    greedy, asks = SamplingParams(max_tokens=24), SamplingParams(max_tokens=3, prompt_logprobs=2)

    def run(ps, params, arrivals):
        rt = _runtime(lm, net, len(ps))
        return staggered_sequences(rt.batcher, ps, arrivals, params, lm.tokenizer.stop_ids), rt

    plain, _ = run(prompts, greedy, [0, 0, 1, 3])
    (alone,), _ = run([scored], [asks], [0])
    seqs, rt = run(prompts + [scored], [greedy] * 4 + [asks], [0, 0, 1, 3, 2])
    assert rt.batcher.drafter.name == "dflash" and sum(s.num_drafted for s in seqs) > 0
    assert [s.generated for s in seqs[:4]] == [s.generated for s in plain]
    got = seqs[4].prompt_logprobs
    assert len(got) == len(scored) - 1 and all(_same(a, b) for a, b in zip(got, alone.prompt_logprobs))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (decode graphs)")
def test_on_the_gpu_a_prompt_scored_while_others_replay_decode_graphs():
    """Gemma 3 270M's shape in bf16 on CUDA: a prompt arriving while three others decode through replayed graphs is
    scored as the log-softmax of the logits the model gives its positions alone (bf16 GEMMs of other row counts: within
    test_cuda_runner's bound, 5% of their scale)."""
    from bench.decode_gpu import gemma270m_args, parley_model, prompts, random_hf_weights
    from tests.engine.test_cuda_runner import REL_GAP, make_batcher as cuda_batcher

    args = gemma270m_args(max_len=512)
    model = parley_model(args, random_hf_weights(args, seed=0), torch.bfloat16, "cuda")
    ids = prompts(args, 4, length=120)
    greedy, asks = SamplingParams(max_tokens=24), SamplingParams(max_tokens=2, prompt_logprobs=3)

    def run(ps, params, arrivals):
        b = cuda_batcher(model, args, 4, 400, graphs=True)
        return staggered_sequences(b, ps, arrivals, params), b

    plain, _ = run(ids[:3], [greedy] * 3, [0, 0, 0])
    seqs, b = run(ids, [greedy] * 3 + [asks], [0, 0, 0, 6])
    # the steps before it arrived are the same; after, a wider step's bf16 rows may flip a near-tie (test_cuda_runner)
    assert b.runner.graphs.replays > 0 and [s.generated[:5] for s in seqs[:3]] == [s.generated[:5] for s in plain]
    got = seqs[3].prompt_logprobs
    want = torch.log_softmax(_gpu_logits(model, args, ids[3]).float().cpu(), dim=-1)[:-1]
    scale = want.std().item()
    assert [lp.token for lp in got] == ids[3][1:]
    assert max(abs(lp.logprob - row[lp.token].item()) for lp, row in zip(got, want)) < REL_GAP * scale


def _gpu_logits(model, args, ids: list[int]) -> torch.Tensor:
    """Every position's logits from one eager prefill of `ids` alone."""
    from tests.engine.test_cuda_runner import make_batcher as cuda_batcher

    b, dev = cuda_batcher(model, args, 1, 400, graphs=False), next(model.parameters()).device
    cache, slot = b.cache, b.cache.seq_new()
    cache.declare_step([(slot, len(ids))])
    b.runner.inputs.prepare() if b.runner.inputs is not None else cache.prepare_step()
    with torch.inference_mode():
        out = model(torch.tensor(ids, device=dev), torch.arange(len(ids), device=dev), cache, None)
    cache.commit_step()
    return out
