"""The embedded Gemma 3 270M against transformers, batch invariance on it, and the logits bound."""
import pytest
import torch

from bench.runs import RunConfig, generate, make_batcher
from engine.sampling import SamplingParams
from tests.support.engine_helpers import alone, run_staggered
from tests.support.gemma_model import LONG_TEXT, PROMPTS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompt_ids(gemma_lm):
    ids = [gemma_lm.tokenizer.encode(p, add_bos=True) for p in PROMPTS]
    assert len(ids[-1]) > 600
    return ids


@pytest.fixture(scope="module")
def hf_greedy(hf_gemma, prompt_ids):
    out = []
    for ids in prompt_ids:
        with torch.no_grad():
            gen = hf_gemma.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None)
        out.append(gen[0, len(ids) :].tolist())
    return out


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_greedy_matches_transformers(gemma_lm, prompt_ids, hf_greedy, layout):
    seqs = generate(gemma_lm, prompt_ids, SamplingParams(max_tokens=32), RunConfig(kv_layout=layout))
    seqs_by_id = sorted(seqs, key=lambda s: s.seq_id)
    stops = gemma_lm.tokenizer.stop_ids
    for seq, want in zip(seqs_by_id, hf_greedy):
        cut = next((i + 1 for i, t in enumerate(want) if t in stops), len(want))  # we stop at <eos>
        assert seq.generated == want[:cut], seq.seq_id


def _last_logits(lm, ids: list[int], chunk: int = 256) -> torch.Tensor:
    """The last position's logits, prefilled chunk by chunk through the cache: one row of logits a chunk (a
    262,144-wide LM head over every one of 600 positions was most of this test's time, on both sides)."""
    b = make_batcher(lm, 1, RunConfig(max_seq_len=len(ids) + 8, step_tokens=chunk, chunk_tokens=chunk))
    cache, slot = b.cache, b.cache.seq_new()
    for start in range(0, len(ids), chunk):
        n = min(chunk, len(ids) - start)
        cache.declare_step([(slot, n)])
        cache.prepare_step()
        with torch.inference_mode():
            last = lm.model(torch.tensor(ids[start : start + n]), torch.arange(start, start + n), cache,
                            torch.tensor([n - 1]))[0]
        cache.commit_step()
    return last


def test_last_position_logits_close(gemma_lm, hf_gemma, prompt_ids):
    worst = 0.0
    for ids in prompt_ids:
        with torch.no_grad():
            want = hf_gemma(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
        got = _last_logits(gemma_lm, ids)
        worst = max(worst, (got - want).abs().max().item())
    print(f"max |logit difference| vs transformers (fp32): {worst:.2e}")
    assert worst < 2e-3


def test_batch_invariance_with_wrapping_rings(gemma_lm):
    """7 prompts of different lengths arrive at different steps; chunk 64 makes the 512-window ring 575 rows."""
    tok = gemma_lm.tokenizer
    texts = [LONG_TEXT, "Hello", LONG_TEXT[:1500], "The quick brown fox", LONG_TEXT[:2600] + " and", "1, 2, 3,", "Q: Why?"]
    prompts = [tok.encode(t, add_bos=True) for t in texts]
    assert max(len(p) for p in prompts) > 600
    arrivals = [0, 0, 1, 3, 3, 6, 9]
    params = SamplingParams(max_tokens=12)
    runs = {layout: RunConfig(kv_layout=layout, max_seq_len=1024, step_tokens=128, chunk_tokens=64)
            for layout in ("sequence", "cell")}
    # each prompt alone once: both layouts give the same greedy tokens (test_greedy_matches_transformers holds
    # each to transformers), so one set of singles serves both (a quarter of the prefill saved)
    singles = [run_staggered(make_batcher(gemma_lm, 1, runs["sequence"]), [p], [0], params, tok.stop_ids)[0]
               for p in prompts]
    for layout, run in runs.items():
        batched = run_staggered(make_batcher(gemma_lm, len(prompts), run), prompts, arrivals, params, tok.stop_ids)
        assert batched == singles, layout


def test_long_prefill_materialises_only_sampled_rows(gemma_lm):
    ids = (gemma_lm.tokenizer.encode(LONG_TEXT, add_bos=True) * 4)[:2048]
    run = RunConfig(max_seq_len=2100, step_tokens=512, chunk_tokens=512, max_sampled_rows=8)
    batcher = make_batcher(gemma_lm, 1, run)
    generate(gemma_lm, [ids], SamplingParams(max_tokens=1), run, batcher=batcher)
    vocab = gemma_lm.args.vocab_size
    assert batcher.runner.peak_logit_elements == vocab  # one sampled row, never the 512-row chunk
    assert batcher.runner.peak_logit_elements <= run.max_sampled_rows * vocab
